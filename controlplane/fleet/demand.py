"""The demand signal the planner reads: pending lines per model (from the batch pipeline through fleet/work.py), measured lines/s
per instance (smoothed), and when each model last had work."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from controlplane.fleet.models import CatalogueModel
from controlplane.fleet.work import Demand, work_source

__all__ = ["Demand", "activity_touch", "demand_by_model", "throughput_refresh"]

# Throughput is averaged over recently finished shards, then smoothed: one slow shard (a cold model,
# a long text) must not halve the instance count the planner asks for.
THROUGHPUT_WINDOW = timedelta(minutes=5)
SMOOTHING = 0.5


def demand_by_model() -> dict[str, Demand]:
    """Catalogue name → lines waiting or running in shards of live batches."""
    return work_source().demand_by_model()


def throughput_refresh() -> None:
    """Update each model's smoothed lines/s per instance from shards finished in the window."""
    since = timezone.now() - THROUGHPUT_WINDOW
    for done in work_source().finished_since(since):
        if done.busy_seconds <= 0 or not done.lines:
            continue
        measured = done.lines / done.busy_seconds
        model = CatalogueModel.objects.filter(name=done.model).first()
        if model is None:
            continue
        old = model.lines_per_second_per_instance
        model.lines_per_second_per_instance = measured if old <= 0 else SMOOTHING * measured + (1 - SMOOTHING) * old
        model.save(update_fields=["lines_per_second_per_instance"])


def activity_touch(names: list[str]) -> None:
    if names:
        CatalogueModel.objects.filter(name__in=names).update(last_active_at=timezone.now())
