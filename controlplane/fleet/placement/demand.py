"""The demand signal the planner reads: pending lines per model (from the batch pipeline through fleet/work.py),
each model's speed per instance (from the scheduler's measured seconds per work unit), and when each model
last had work."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from controlplane.fleet.models import CatalogueModel
from controlplane.fleet.work import Demand, work_source

__all__ = [
    "Demand",
    "activity_touch",
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
