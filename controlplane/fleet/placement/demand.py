"""The demand signal the planner reads: pending lines per model (from the batch pipeline through fleet/work.py),
each model's speed per instance (from the scheduler's measured seconds per work unit), and when each model
last had work."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from controlplane.fleet.models import CatalogueAdapter, CatalogueModel, split_model_name
from controlplane.fleet.work import Demand, work_source

__all__ = [
    "Demand",
    "activity_touch",
    "adapter_activity_touch",
    "demand_by_adapter",
    "demand_by_model",
    "lines_per_second_per_instance",
    "units_per_second_per_instance",
]


def demand_by_model() -> dict[str, Demand]:
    """Catalogue name → lines (and work units) waiting or running in shards of live batches."""
    return work_source().demand_by_model()


def units_per_second_per_instance(model: CatalogueModel) -> float:
    """Work units per second one instance serves (0 = unknown). ``seconds_per_work_unit`` is measured per
    dispatch slot (scheduling/claims.py), and an instance takes SCHEDULER_CALLS_PER_INSTANCE calls, a slot
    DISPATCH_INFLIGHT_CALLS of them."""
    if model.seconds_per_work_unit <= 0:
        return 0.0
    slots_per_instance = settings.SCHEDULER_CALLS_PER_INSTANCE / settings.DISPATCH_INFLIGHT_CALLS
    return slots_per_instance / model.seconds_per_work_unit


def lines_per_second_per_instance(model: CatalogueModel, demand: Demand | None) -> float:
    """The planner's rate, in the lines it counts: work units per second converted at the pending work's own
    lines per unit (a line's tokens or rows), so long texts ask for more instances than short ones. 0 when
    either is unknown (the planner then keeps the size of a busy model)."""
    units = units_per_second_per_instance(model)
    if demand is None or units <= 0 or demand.pending_work_units <= 0:
        return 0.0
    return units * demand.pending_lines / demand.pending_work_units


def activity_touch(names: list[str]) -> None:
    if names:
        CatalogueModel.objects.filter(name__in=names).update(last_active_at=timezone.now())


def demand_by_adapter() -> dict[str, dict[str, int]]:
    """Base catalogue name → adapter name → lines naming it waiting or running in shards of live batches
    (``Shard.adapter_lines``, counted at validation). Those lines are in the base's ``demand_by_model`` too: a
    batch is its base's, so the base is placed for its adapters' lines as for its own."""
    by_base: dict[str, dict[str, int]] = {}
    for full_name, lines in work_source().demand_by_adapter().items():
        base, adapter = split_model_name(full_name)
        if adapter and lines > 0:
            by_base.setdefault(base, {})[adapter] = lines
    return by_base


def adapter_activity_touch(demand: dict[str, dict[str, int]]) -> None:
    """``last_active_at`` of every adapter with lines now: the residency plan's least-recently-used order."""
    now = timezone.now()
    for base, adapters in demand.items():
        CatalogueAdapter.objects.filter(base__name=base, name__in=list(adapters)).update(last_active_at=now)
