"""Gauges computed from the database when ``/metrics`` is scraped: a handful of grouped queries per scrape,
none on the hot path. Exported by exactly one deployment (the one with ``METRICS_DB_GAUGES=1``): every
process could compute them, and summing them over replicas would count the queue several times."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from django.db.models import Count, Min, Sum
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from controlplane.batches.models import BatchStatus, Shard, ShardStatus
from controlplane.fleet.models import FleetSizePlan, Placement, TritonServer
from controlplane.metrics.triton_scrape import triton_families
from controlplane.scheduling.selectors import runnable_q

# A dead shard matters while its batch is still open: an operator can requeue it
# (docs/operations/runbooks/BatchDeadShards.md).
_OPEN_BATCH_STATUSES = (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)


class DatabaseCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from _queue_families(now)
        yield _dead_shards()
        yield _breakers(now)
        yield from _placements()
        yield from _fleet_size(now)
        yield from triton_families()  # Triton's own /metrics, normalised (triton_scrape.py)


def _queue_families(now: datetime) -> Iterator[GaugeMetricFamily]:
    shards = {
        state: GaugeMetricFamily(
            f"batch_shards_{state}", f"Shards {state} now, by model and priority class.", labels=["model", "priority"]
        )
        for state in ("runnable", "running")
    }
    lines = {
        state: GaugeMetricFamily(
            f"batch_lines_{state}",
            f"Input lines in shards {state} now, by model and priority class.",
            labels=["model", "priority"],
        )
        for state in ("runnable", "running")
    }
    oldest = GaugeMetricFamily(
        "batch_oldest_runnable_age_seconds",
        "Age of the oldest runnable work per model: now minus the earliest start (in_progress) of a batch "
        "that still has a runnable shard.",
        labels=["model"],
    )
    deadline = GaugeMetricFamily(
        "batch_runnable_deadline_seconds",
        "Seconds left until the earliest expiry among batches with runnable shards, per model (negative: past).",
        labels=["model"],
    )
    earliest: dict[str, tuple[datetime | None, datetime | None]] = {}
    runnable = (
        Shard.objects.filter(runnable_q(now))
        .values("batch__model", "batch__priority")
        .annotate(
            shards=Count("id"),
            lines=Sum("request_count"),
            started=Min("batch__in_progress_at"),
            expires=Min("batch__expires_at"),
        )
    )
    for row in runnable:
        labels = [row["batch__model"], row["batch__priority"]]
        shards["runnable"].add_metric(labels, row["shards"])
        lines["runnable"].add_metric(labels, row["lines"] or 0)
        started, expires = earliest.get(row["batch__model"], (None, None))
        earliest[row["batch__model"]] = (_min(started, row["started"]), _min(expires, row["expires"]))
    for model, (started, expires) in sorted(earliest.items()):
        oldest.add_metric([model], (now - started).total_seconds() if started else 0.0)
        if expires is not None:
            deadline.add_metric([model], (expires - now).total_seconds())
    running = (
        Shard.objects.filter(status=ShardStatus.RUNNING)
        .values("batch__model", "batch__priority")
        .annotate(shards=Count("id"), lines=Sum("request_count"))
    )
    for row in running:
        labels = [row["batch__model"], row["batch__priority"]]
        shards["running"].add_metric(labels, row["shards"])
        lines["running"].add_metric(labels, row["lines"] or 0)
    yield from shards.values()
    yield from lines.values()
    yield oldest
    yield deadline


def _min(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else min(a, b)


def _dead_shards() -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "batch_shards_dead", "Dead-letter shards of batches still open (requeueable), by model.", labels=["model"]
    )
    rows = (
        Shard.objects.filter(status=ShardStatus.DEAD, batch__status__in=_OPEN_BATCH_STATUSES)
        .values("batch__model")
        .annotate(n=Count("id"))
    )
    for row in rows:
        family.add_metric([row["batch__model"]], row["n"])
    return family


def _breakers(now: datetime) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "triton_server_breaker_open",
        "1 while a registered server's circuit breaker is open, else 0.",
        labels=["server"],
    )
    for name, open_until in TritonServer.objects.values_list("name", "breaker_open_until"):
        family.add_metric([name], 1.0 if open_until is not None and open_until > now else 0.0)
    return family


def _placements() -> Iterator[GaugeMetricFamily]:
    placements = GaugeMetricFamily(
        "fleet_placements",
        "Placements by model, server and status (loading, ready, failed).",
        labels=["model", "server", "status"],
    )
    instances = GaugeMetricFamily(
        "fleet_instances", "Model instances placed, by model, server and status.", labels=["model", "server", "status"]
    )
    rows = Placement.objects.values("model__name", "server__name", "status").annotate(
        n=Count("id"), instances=Sum("instances")
    )
    for row in rows:
        labels = [row["model__name"], row["server__name"], row["status"]]
        placements.add_metric(labels, row["n"])
        instances.add_metric(labels, row["instances"] or 0)
    yield placements
    yield instances


def _fleet_size(now: datetime) -> Iterator[GaugeMetricFamily]:
    """The latest fleet-size plan (fleet.size_plan, stored per pool) and the inputs an autoscaler or a
    person checks it against: what KEDA's prometheus trigger and the local orchestrator follow."""
    servers = GaugeMetricFamily(
        "batch_fleet_desired_servers", "Triton servers the fleet-size loop wants, per pool.", labels=["pool"]
    )
    workers = GaugeMetricFamily("batch_fleet_desired_workers", "Shard workers the fleet-size loop wants.")
    backlog = GaugeMetricFamily(
        "batch_fleet_backlog_work_seconds",
        "Backlog per pool in instance-seconds: work units pending or running / measured units per second.",
        labels=["pool"],
    )
    risk = GaugeMetricFamily(
        "batch_fleet_deadline_risk",
        "1 when the pool's servers now cannot finish some batch's work before its expiry, else 0.",
        labels=["pool"],
    )
    age = GaugeMetricFamily(
        "batch_fleet_plan_age_seconds",
        "Seconds since the pool's plan was computed (beat stalled if it grows).",
        labels=["pool"],
    )
    rows = list(FleetSizePlan.objects.order_by("pool"))
    for row in rows:
        servers.add_metric([row.pool], row.desired_servers)
        work_s = row.inputs.get("backlog_work_seconds")
        backlog.add_metric([row.pool], float("inf") if work_s is None else float(work_s))  # null: it overflowed
        risk.add_metric([row.pool], 1.0 if row.inputs.get("deadline_risk") else 0.0)
        age.add_metric([row.pool], (now - row.computed_at).total_seconds())
    if rows:
        workers.add_metric([], max(row.desired_workers for row in rows))
    yield from (servers, workers, backlog, risk, age)
