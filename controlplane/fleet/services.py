from __future__ import annotations

import logging

from django.db import transaction

from controlplane.core.http.errors import NotFound, ValidationFailed
from controlplane.core.messaging import dispatch
from controlplane.fleet.catalogue.seed import ADAPTER_SEED, SEED
from controlplane.fleet.models import CatalogueAdapter, CatalogueModel, PlacementEvent

logger = logging.getLogger(__name__)


@transaction.atomic
def catalogue_seed_defaults() -> None:
    """(Re)create the entries for the models shipped in triton_models/; other entries are untouched."""
    for entry in SEED:
        CatalogueModel.objects.update_or_create(name=entry["name"], defaults=entry)
    for adapter in ADAPTER_SEED:
        base = CatalogueModel.objects.get(name=adapter["base"])
        fields = {k: v for k, v in adapter.items() if k not in ("base", "name")}
        CatalogueAdapter.objects.update_or_create(base=base, name=adapter["name"], defaults=fields)


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


def model_set_paused(*, model_id: int, paused: bool, actor: str) -> bool:
    """Pause or resume dispatch of a catalogue model: its batches stay in_progress and running shards
    finish, but no new shard of it is claimed (selectors.runnable_shards). Returns whether anything
    changed; only a change writes a PlacementEvent, the catalogue's audit trail in the fleet admin."""
    with transaction.atomic():
        name = CatalogueModel.objects.filter(id=model_id).values_list("name", flat=True).first()
        if name is None:
            raise NotFound(f"No catalogue model with id {model_id}.", param="model_id")
        # Conditional, so a repeated click (or two operators at once) records one event, not two.
        changed = CatalogueModel.objects.filter(id=model_id, paused=not paused).update(paused=paused)
        if changed:
            verb = "paused" if paused else "resumed"
            PlacementEvent.objects.create(
                model_id=model_id,
                action=f"model_{verb}",
                actor=actor[:100],
                reason="no new shards are dispatched" if paused else "dispatch resumed",
            )
            logger.info("model %s %s by %s", name, verb, actor)
            dispatch.slots_topup_enqueue(name)
    return bool(changed)
