"""The demand signal the planner reads: pending lines per model from the shard table, measured lines/s
per instance (smoothed), and when each model last had work."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from controlplane.batches.models import BatchStatus, Shard, ShardStatus
from controlplane.fleet.models import CatalogueModel

# Throughput is averaged over recently finished shards, then smoothed: one slow shard (a cold model,
# a long text) must not halve the instance count the planner asks for.
THROUGHPUT_WINDOW = timedelta(minutes=5)
SMOOTHING = 0.5


@dataclass(frozen=True)
class Demand:
    pending_lines: int
    in_flight_shards: int


def demand_by_model() -> dict[str, Demand]:
    """Catalogue name → lines waiting or running in shards of live batches."""
    rows = (
        Shard.objects.filter(
            status__in=(ShardStatus.PENDING, ShardStatus.RUNNING),
            batch__status=BatchStatus.IN_PROGRESS,
            batch__stop_reason__isnull=True,
        )
        .values("batch__model")
        .annotate(lines=Sum("request_count"), running=Count("id", filter=Q(status=ShardStatus.RUNNING)))
    )
    return {row["batch__model"]: Demand(int(row["lines"] or 0), int(row["running"])) for row in rows}


def throughput_refresh() -> None:
    """Update each model's smoothed lines/s per instance from shards finished in the window."""
    since = timezone.now() - THROUGHPUT_WINDOW
    rows = (
        Shard.objects.filter(status=ShardStatus.SUCCEEDED, finished_at__gte=since, started_at__isnull=False)
        .values("batch__model")
        .annotate(lines=Sum(F("completed_lines") + F("failed_lines")), busy=Sum(F("finished_at") - F("started_at")))
    )
    for row in rows:
        seconds = row["busy"].total_seconds() if row["busy"] else 0.0
        if seconds <= 0 or not row["lines"]:
            continue
        measured = row["lines"] / seconds
        model = CatalogueModel.objects.filter(name=row["batch__model"]).first()
        if model is None:
            continue
        old = model.lines_per_second_per_instance
        model.lines_per_second_per_instance = measured if old <= 0 else SMOOTHING * measured + (1 - SMOOTHING) * old
        model.save(update_fields=["lines_per_second_per_instance"])


def activity_touch(names: list[str]) -> None:
    if names:
        CatalogueModel.objects.filter(name__in=names).update(last_active_at=timezone.now())
