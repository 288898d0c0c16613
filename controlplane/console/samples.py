"""Beat's samples for the dashboards (console.samples_take): per model the queue, what finished since the
previous tick and the capacity in use; per server the instances and GPU utilisation. Then old samples are
pruned. A handful of grouped queries per tick, whatever the traffic; no Prometheus needed.

Queue depth uses the scheduler's own definition of runnable (scheduling.selectors.runnable_q) and the
model's slot cap (model_slot_cap), so the chart and the queue page agree."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone

from controlplane.batches.models import SHARD_OPEN_STATUSES, Shard, ShardStatus
from controlplane.console.models import ModelSample, ServerSample
from controlplane.fleet.models import CatalogueModel, Gpu, Placement, PlacementStatus, TritonServer
from controlplane.scheduling.models import Slot, SlotState
from controlplane.scheduling.selectors import model_slot_cap, runnable_q

logger = logging.getLogger(__name__)

# A tick after a long pause (beat down) covers at most this much history: the rate over hours of silence
# would flatten into one misleading point, so the rest of the gap stays a gap on the charts.
MAX_INTERVAL = timedelta(minutes=10)
# Samples deleted per statement when pruning: short transactions even on the first prune of a large table.
PRUNE_CHUNK = 5000


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0–100) of unsorted values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def samples_take(*, now: datetime | None = None) -> int:
    """Store one tick of samples and prune old ones. Returns the number of rows written."""
    now = now or timezone.now()
    last = ModelSample.objects.order_by("-taken_at").values_list("taken_at", flat=True).first()
    default_since = now - timedelta(seconds=settings.CONSOLE_SAMPLES_INTERVAL_SECONDS)
    since = default_since if last is None or last >= now else max(last, now - MAX_INTERVAL)
    model_rows = _model_samples(now=now, since=since)
    server_rows = _server_samples(now=now)
    with transaction.atomic():
        ModelSample.objects.bulk_create(model_rows)
        ServerSample.objects.bulk_create(server_rows)
    samples_prune(before=now - timedelta(days=settings.CONSOLE_SAMPLES_RETENTION_DAYS))
    return len(model_rows) + len(server_rows)


def _model_samples(*, now: datetime, since: datetime) -> list[ModelSample]:
    models = list(CatalogueModel.objects.order_by("name"))
    paused = [m.name for m in models if m.paused]
    # A paused model's pending shards are held, not runnable (runnable_q does not know models' pauses).
    runnable = runnable_q(now) & ~Q(batch__model__in=paused)
    queue = {
        row["batch__model"]: row
        for row in Shard.objects.filter(status__in=SHARD_OPEN_STATUSES)
        .order_by()
        .values("batch__model")
        .annotate(
            runnable=Count("id", filter=runnable),
            lines=Sum("request_count", filter=runnable),
            running=Count("id", filter=Q(status=ShardStatus.RUNNING)),
        )
    }
    # Lines count when their shard commits (finished_at), as the Prometheus counters do. Stopped shards
    # (cancel, expiry) committed lines too; dead ones did not.
    finished = Shard.objects.filter(
        finished_at__gt=since, finished_at__lte=now, status__in=(ShardStatus.SUCCEEDED, ShardStatus.STOPPED)
    )
    done = {
        row["batch__model"]: row
        for row in finished.order_by()
        .values("batch__model")
        .annotate(completed=Sum("completed_lines"), failed=Sum("failed_lines"), n=Count("id"))
    }
    durations: dict[str, list[float]] = {}
    for name, started, ended in finished.filter(started_at__isnull=False).values_list(
        "batch__model", "started_at", "finished_at"
    ):
        if started is not None and ended is not None:
            durations.setdefault(name, []).append((ended - started).total_seconds())
    instances = dict(
        Placement.objects.filter(status=PlacementStatus.READY)
        .order_by()
        .values("model_id")
        .annotate(n=Sum("instances"))
        .values_list("model_id", "n")
    )
    slots = dict(
        Slot.objects.filter(state=SlotState.RUNNING, expires_at__gte=now)
        .order_by()
        .values("model_id")
        .annotate(n=Count("id"))
        .values_list("model_id", "n")
    )
    epoch, interval = int(now.timestamp()), (now - since).total_seconds()
    rows = []
    for model in models:
        q, d, spans = queue.get(model.name, {}), done.get(model.name, {}), durations.get(model.name, [])
        if not (model.is_enabled or q or d):
            continue  # a disabled model with nothing left to show
        rows.append(
            ModelSample(
                taken_at=now,
                epoch=epoch,
                interval_seconds=interval,
                model=model.name,
                runnable_shards=q.get("runnable") or 0,
                runnable_lines=q.get("lines") or 0,
                running_shards=q.get("running") or 0,
                lines_completed=d.get("completed") or 0,
                lines_failed=d.get("failed") or 0,
                shards_finished=d.get("n") or 0,
                shard_p50_seconds=percentile(spans, 50),
                shard_p95_seconds=percentile(spans, 95),
                shard_p99_seconds=percentile(spans, 99),
                instances=instances.get(model.id) or 0,
                slot_cap=model_slot_cap(model),
                slots_running=slots.get(model.id) or 0,
            )
        )
    return rows


def _server_samples(*, now: datetime) -> list[ServerSample]:
    instances = dict(
        Placement.objects.filter(status=PlacementStatus.READY)
        .order_by()
        .values("server_id")
        .annotate(n=Sum("instances"))
        .values_list("server_id", "n")
    )
    utilisation: dict[int, list[float]] = {}
    for server_id, value in Gpu.objects.filter(utilization__isnull=False).values_list("server_id", "utilization"):
        if value is not None:
            utilisation.setdefault(server_id, []).append(float(value))
    # A shard's triton_server names the servers its calls went to ("a" or "a,b" when it moved mid-way).
    running = list(Shard.objects.filter(status=ShardStatus.RUNNING).values_list("triton_server", flat=True))
    epoch = int(now.timestamp())
    return [
        ServerSample(
            taken_at=now,
            epoch=epoch,
            server=name,
            instances=instances.get(server_id) or 0,
            running_shards=sum(1 for names in running if name in names.split(",")),
            gpu_utilization=sum(utilisation[server_id]) / len(utilisation[server_id])
            if server_id in utilisation
            else None,
        )
        for server_id, name in TritonServer.objects.order_by("name").values_list("id", "name")
    ]


def samples_prune(*, before: datetime) -> int:
    """Delete samples taken before ``before`` in chunks; returns how many went."""
    deleted, epoch = 0, int(before.timestamp())
    for model in (ModelSample, ServerSample):
        while True:
            ids = list(model.objects.filter(epoch__lt=epoch).values_list("id", flat=True)[:PRUNE_CHUNK])
            if not ids:
                break
            deleted += model.objects.filter(id__in=ids).delete()[0]
    if deleted:
        logger.info("pruned %d dashboard samples taken before %s", deleted, before.isoformat())
    return deleted
