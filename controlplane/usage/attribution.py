"""Attributing measured compute time to ledger rows (docs/operations/usage.md).

Triton's statistics are per model and server, across every caller. Each run reads every ready placement's
cumulative compute time; its growth since the last read (plus busy time carried from reads when no shard
of it committed) is split across the ledger rows that ran there and are not yet attributed, in proportion
to their tokens (embeddings) or rows (tensors). Each read also records the placement's offered
instance-seconds (instances × interval), so idle capacity = instance-seconds - attributed seconds."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from controlplane.fleet.models import Placement, PlacementStatus
from controlplane.triton.client import TritonError
from controlplane.usage.models import CapacityInterval, ComputeSource, StatisticsCursor, UsageRecord
from controlplane.usage.rules import counter_delta, split_delta
from controlplane.usage.services import usage_records_attribute

logger = logging.getLogger(__name__)

# (grpc_url, triton model) → cumulative compute nanoseconds; raises TritonError when unreadable.
ComputeReader = Callable[[str, str], int]


@dataclass
class AttributionReport:
    placements_read: int = 0
    records_attributed: int = 0
    unreadable: list[str] = field(default_factory=list)


def _ran_on(record_server: str, server: str) -> bool:
    # A shard routed across the fleet names every server it used, comma-separated (fleet/backend.py).
    return server in record_server.split(",")


def usage_attribute(*, now: datetime, read: ComputeReader) -> AttributionReport:
    """One attribution interval for every ready placement (the beat task ``usage.attribute``). Triton is
    read first; the ledger is then changed in one transaction, so a failure loses no busy time."""
    report = AttributionReport()
    readings: list[tuple[Placement, int]] = []
    placements = Placement.objects.filter(status=PlacementStatus.READY).select_related("server", "model")
    for placement in placements:
        try:
            readings.append((placement, read(placement.server.grpc_url, placement.model.triton_name)))
        except TritonError as exc:
            report.unreadable.append(f"{placement.model.triton_name}@{placement.server.name}: {exc}")
    report.placements_read = len(readings)
    with transaction.atomic():
        shares_ns: dict[int, int] = defaultdict(int)
        for placement, total_ns in readings:
            _placement_attribute(placement, total_ns, now, shares_ns)
        usage_records_attribute(shares={record_id: ns / 1e9 for record_id, ns in shares_ns.items()})
    report.records_attributed = len(shares_ns)
    return report


def _candidates(*, server: str, triton_model: str, now: datetime) -> list[tuple[int, int]]:
    """(ledger row id, weight) of the rows not yet attributed that ran on this placement: tokens for
    embeddings, rows for tensor models."""
    oldest = now - timedelta(seconds=settings.USAGE_ATTRIBUTION_MAX_AGE_SECONDS)
    rows = (
        UsageRecord.objects.filter(
            triton_model=triton_model,
            compute_source=ComputeSource.DISPATCH,
            finished_at__lte=now,
            finished_at__gte=oldest,
            server__contains=server,
        )
        .order_by("id")
        .values_list("id", "server", "tokens", "rows")
    )
    return [
        (record_id, tokens or rows) for record_id, record_server, tokens, rows in rows if _ran_on(record_server, server)
    ]


def _placement_attribute(placement: Placement, total_ns: int, now: datetime, shares_ns: dict[int, int]) -> None:
    server, triton_model = placement.server.name, placement.model.triton_name
    cursor = StatisticsCursor.objects.select_for_update().filter(server=server, triton_model=triton_model).first()
    if cursor is None:
        # First sight: only a baseline, since what the counter holds may predate the ledger.
        StatisticsCursor.objects.create(server=server, triton_model=triton_model, compute_ns=total_ns, read_at=now)
        return
    if cursor.read_at >= now:
        return  # a concurrent or later run already covered this interval
    busy_ns = counter_delta(previous=cursor.compute_ns, current=total_ns)
    pool_ns = busy_ns + cursor.carry_ns
    elapsed = min((now - cursor.read_at).total_seconds(), settings.USAGE_ATTRIBUTION_MAX_GAP_SECONDS)
    candidates = _candidates(server=server, triton_model=triton_model, now=now)
    attributed_ns = 0
    # No growth: leave the rows on their dispatch time (the baseline may postdate their calls).
    if candidates and pool_ns:
        for (record_id, _), share in zip(candidates, split_delta(pool_ns, [w for _, w in candidates]), strict=True):
            shares_ns[record_id] += share
        attributed_ns = pool_ns
    CapacityInterval.objects.create(
        server=server,
        triton_model=triton_model,
        started_at=now - timedelta(seconds=elapsed),
        ended_at=now,
        instances=placement.instances,
        instance_seconds=placement.instances * elapsed,
        busy_seconds=busy_ns / 1e9,
        attributed_seconds=attributed_ns / 1e9,
        records=len(candidates),
    )
    StatisticsCursor.objects.filter(id=cursor.id).update(
        compute_ns=total_ns, read_at=now, carry_ns=pool_ns - attributed_ns
    )
