from __future__ import annotations

from django.db import transaction

from controlplane.core.errors import NotFound, ValidationFailed
from controlplane.fleet.models import CatalogueModel, PlacementEvent
from controlplane.fleet.seed import SEED


@transaction.atomic
def catalogue_seed_defaults() -> None:
    """(Re)create the entries for the models shipped in triton_models/; other entries are untouched."""
    for entry in SEED:
        CatalogueModel.objects.update_or_create(name=entry["name"], defaults=entry)


@transaction.atomic
def catalogue_set_min_instances(*, names: list[str], min_instances: int, actor: str) -> list[CatalogueModel]:
    """Set the planner's floor for the named catalogue models: all of them or, on an unknown name or a
    floor above a model's max_instances, none. min_instances >= 1 keeps a model loaded while idle (no
    first-batch wait for a load); 0 lets it scale to zero after the idle TTL. The reconciler applies it on
    its next run; each change is a PlacementEvent, so the admin shows who pinned a model warm and when."""
    if min_instances < 0:
        raise ValidationFailed("min_instances must be >= 0", param="min_instances")
    models = {m.name: m for m in CatalogueModel.objects.select_for_update().filter(name__in=names)}
    unknown = sorted(set(names) - set(models))
    if unknown:
        raise NotFound(f"no catalogue model named {', '.join(map(repr, unknown))}", param="names")
    too_high = sorted(name for name, m in models.items() if min_instances > m.max_instances)
    if too_high:
        raise ValidationFailed(
            f"min_instances={min_instances} exceeds max_instances of {', '.join(map(repr, too_high))}",
            param="min_instances",
        )
    for model in models.values():
        if model.min_instances == min_instances:
            continue
        PlacementEvent.objects.create(
            model=model,
            action="min_instances",
            before=model.min_instances,
            after=min_instances,
            actor=actor,
            reason=f"catalogue floor set to {min_instances}",
        )
        CatalogueModel.objects.filter(id=model.id).update(min_instances=min_instances)
        model.min_instances = min_instances
    return [models[name] for name in dict.fromkeys(names)]
