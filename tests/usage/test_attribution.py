"""The attribution beat against the database: Triton's busy-time growth per placement is split across
the ledger rows that ran there, idle capacity is recorded, and unreadable placements change nothing."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from django.utils import timezone

from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel, Placement, PlacementStatus, TritonServer
from controlplane.triton.client import TransientTritonError
from controlplane.usage import selectors
from controlplane.usage.attribution import usage_attribute
from controlplane.usage.models import CapacityInterval, UsageRecord
from tests.usage.helpers import embedding_lines, price_set, run_batch

pytestmark = pytest.mark.django_db(transaction=True)


def _placement(server_name: str, instances: int = 2) -> Placement:
    server = TritonServer.objects.create(name=server_name, grpc_url=f"{server_name}:8001")
    model = CatalogueModel.objects.get(name="all-MiniLM-L6-v2")
    return Placement.objects.create(
        model=model, server=server, gpus="0", instances=instances, status=PlacementStatus.READY
    )


def test_busy_time_is_split_by_tokens_and_idle_is_recorded(tenant):
    _placement("fake:0")
    counters = {"fake:0:8001": 1_000_000_000}
    read = lambda url, model: counters[url]  # noqa: E731
    now = timezone.now()
    assert usage_attribute(now=now - datetime.timedelta(seconds=15), read=read).records_attributed == 0  # baseline
    price_set("all-MiniLM-L6-v2", gpu_second="2")
    batch = run_batch(tenant, embedding_lines(9))
    rows = list(UsageRecord.objects.filter(batch_id=batch.id).order_by("id"))
    assert len(rows) == 3
    counters["fake:0:8001"] += 3_000_000_000  # Triton measured 3 s of compute since the baseline
    report = usage_attribute(now=timezone.now(), read=read)
    assert report.records_attributed == 3
    attributed = list(UsageRecord.objects.filter(batch_id=batch.id).order_by("id"))
    assert {r.compute_source for r in attributed} == {"statistics"}
    assert sum(r.compute_seconds for r in attributed) == pytest.approx(3.0)
    total_tokens = sum(r.tokens for r in rows)
    for row in attributed:
        assert row.compute_seconds == pytest.approx(3.0 * row.tokens / total_tokens, abs=1e-9)
        assert row.cost == (row.price_per_gpu_second * Decimal(repr(row.compute_seconds))).quantize(Decimal("1e-9"))
    [interval] = CapacityInterval.objects.all()
    assert interval.busy_seconds == pytest.approx(3.0) == interval.attributed_seconds
    assert interval.instance_seconds == pytest.approx(2 * (interval.ended_at - interval.started_at).total_seconds())
    today = timezone.now().date()
    [idle] = selectors.idle_capacity_per_day(start=today, end=today + datetime.timedelta(days=1))
    assert idle.attributed_seconds == pytest.approx(3.0)
    assert idle.instance_seconds == pytest.approx(interval.instance_seconds)
    # A run for an instant already covered (a second beat) changes nothing.
    assert usage_attribute(now=interval.ended_at, read=read).records_attributed == 0
    assert CapacityInterval.objects.count() == 1
    # Attributed rows are not attributed twice; growth with no shard is carried to the next ones.
    counters["fake:0:8001"] += 500_000_000
    assert usage_attribute(now=timezone.now(), read=read).records_attributed == 0
    second = run_batch(tenant, embedding_lines(3, prefix="z"))
    counters["fake:0:8001"] += 250_000_000
    usage_attribute(now=timezone.now(), read=read)
    [row] = UsageRecord.objects.filter(batch_id=second.id)
    assert row.compute_source == "statistics" and row.compute_seconds == pytest.approx(0.75)


def test_unreadable_placement_keeps_dispatch_time(tenant):
    _placement("fake:0")

    def down(url: str, model: str) -> int:
        raise TransientTritonError("unreachable")

    batch = run_batch(tenant, embedding_lines(3))
    report = usage_attribute(now=timezone.now(), read=down)
    assert report.placements_read == 0 and report.unreadable
    row = UsageRecord.objects.get(batch_id=batch.id)
    assert row.compute_source == "dispatch" and row.compute_seconds == row.dispatch_seconds
    assert not CapacityInterval.objects.exists()
