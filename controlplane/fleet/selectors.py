from __future__ import annotations

from controlplane.fleet.models import CatalogueModel


def catalogue_model_get(*, name: str) -> CatalogueModel | None:
    return CatalogueModel.objects.filter(name=name, is_enabled=True).first()


def catalogue_names() -> list[str]:
    return list(CatalogueModel.objects.filter(is_enabled=True).order_by("name").values_list("name", flat=True))
