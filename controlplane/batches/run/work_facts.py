"""The shard table's answers to what fleet asks (fleet/work.py): live demand, backlog by batch deadline and
the shards routed to a server. Registered as fleet's WorkSource in apps.py."""

from __future__ import annotations

import re

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from controlplane.batches.models import RUNNABLE_BATCH_STATUSES, Shard, ShardStatus
from controlplane.fleet.work import BatchBacklog, Demand


def _open_shards() -> QuerySet[Shard]:
    return Shard.objects.filter(
        status__in=(ShardStatus.PENDING, ShardStatus.RUNNING),
        # Validating included: its early-dispatched shards run (the scheduler claims them), so the model
        # is busy; counted out, the planner saw it idle and evicted its instance mid-batch.
        batch__status__in=RUNNABLE_BATCH_STATUSES,
        batch__stop_reason__isnull=True,
    )


class ShardWork:
    def demand_by_model(self) -> dict[str, Demand]:
        rows = (
            _open_shards()
            .values("batch__model")
            .annotate(
                lines=Sum("request_count"),
                work=Sum("work_units"),
                running=Count("id", filter=Q(status=ShardStatus.RUNNING)),
            )
        )
        return {
            row["batch__model"]: Demand(int(row["lines"] or 0), int(row["running"]), float(row["work"] or 0))
            for row in rows
        }

    def demand_by_adapter(self) -> dict[str, int]:
        # Only shards with adapter lines carry the field; a running shard counts whole (it runs for about a second).
        lines: dict[str, int] = {}
        for counts in _open_shards().filter(adapter_lines__isnull=False).values_list("adapter_lines", flat=True):
            for name, count in (counts or {}).items():
                lines[name] = lines.get(name, 0) + int(count)
        return lines

    def schedulable_backlog(self) -> list[BatchBacklog]:
        # Pending work of a paused tenant is left out: it cannot run, so servers would not help it.
        live = Q(status=ShardStatus.RUNNING) | Q(status=ShardStatus.PENDING, batch__tenant__paused=False)
        rows = (
            Shard.objects.filter(live, batch__status__in=RUNNABLE_BATCH_STATUSES, batch__stop_reason__isnull=True)
            .values("batch_id", "batch__model", "batch__expires_at")
            .annotate(
                work=Sum("work_units"),
                lines=Sum("request_count"),
                running=Count("id", filter=Q(status=ShardStatus.RUNNING)),
                running_work=Sum("work_units", filter=Q(status=ShardStatus.RUNNING)),
            )
        )
        return [
            BatchBacklog(
                model=row["batch__model"],
                expires_at=row["batch__expires_at"],
                work_units=float(row["work"]) if row["work"] else None,
                lines=int(row["lines"] or 0),
                running_shards=int(row["running"]),
                running_work_units=float(row["running_work"] or 0),
            )
            for row in rows
        ]

    def shards_routed_to(self, server_name: str) -> int:
        # A dead worker's shard sends nothing (expired lease); Shard.triton_server lists the routes it started with.
        return (
            Shard.objects.filter(
                status=ShardStatus.RUNNING,
                lease_expires_at__gt=timezone.now(),
                triton_server__regex=rf"(^|,){re.escape(server_name)}(,|$)",
            )
            .only("id")
            .count()
        )
