from __future__ import annotations

from django.db import transaction

from controlplane.fleet.models import CatalogueModel
from controlplane.fleet.seed import SEED


@transaction.atomic
def catalogue_seed_defaults() -> None:
    """(Re)create the entries for the models shipped in triton_models/; other entries are untouched."""
    for entry in SEED:
        CatalogueModel.objects.update_or_create(name=entry["name"], defaults=entry)
