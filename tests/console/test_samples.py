"""Beat's dashboard samples against real Postgres: what one tick stores from shard, slot, placement and GPU
rows, how ticks chain their intervals, the retention prune, and the dashboard's bucketed series."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches.models import Shard, ShardStatus
from controlplane.console.models import ModelSample, ServerSample
from controlplane.console.samples import percentile, samples_take
from controlplane.console.selectors import bucket_seconds_for, dashboard
from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.models import CatalogueModel, Gpu, Placement
from controlplane.scheduling.models import Slot, SlotState
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db

GIB = 1024**3


def test_percentile_is_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 99)) == (50.0, 95.0, 99.0)
    assert percentile([1.0, 3.0], 50) == 1.0 and percentile([1.0, 3.0], 95) == 3.0


@pytest.fixture
def busy_identity(catalogue, settings):
    """An identity batch of four 4-line shards: two finished in the last seconds (1 s and 3 s long), one
    running on triton-a, one runnable; plus one shard finished long before any tick's interval."""
    settings.SHARD_MAX_LINES = 4
    now = timezone.now()
    batch = runnable_batch(new_tenant("acme"), 20)
    shards = list(Shard.objects.filter(batch=batch).order_by("index"))
    assert len(shards) == 5
    for shard, took, failed in ((shards[0], 1.0, 0), (shards[1], 3.0, 1)):
        end = now - timedelta(seconds=5)
        Shard.objects.filter(id=shard.id).update(
            status=ShardStatus.SUCCEEDED,
            started_at=end - timedelta(seconds=took),
            finished_at=end,
            completed_lines=4 - failed,
            failed_lines=failed,
        )
    Shard.objects.filter(id=shards[2].id).update(status=ShardStatus.RUNNING, triton_server="triton-a")
    long_ago = now - timedelta(hours=1)
    Shard.objects.filter(id=shards[4].id).update(
        status=ShardStatus.SUCCEEDED, started_at=long_ago, finished_at=long_ago, completed_lines=4
    )
    return now


def test_a_tick_stores_queue_throughput_latency_and_capacity(busy_identity):
    now = busy_identity
    server = server_register(name="triton-a", grpc_url="a:8001", gpu_memory_bytes=[16 * GIB, 16 * GIB])
    server_register(name="triton-b", grpc_url="b:8001", gpu_memory_bytes=[16 * GIB])
    Gpu.objects.filter(server=server, index=0).update(utilization=0.5)
    Gpu.objects.filter(server=server, index=1).update(utilization=0.7)
    identity = CatalogueModel.objects.get(name="identity")
    Placement.objects.create(model=identity, server=server, gpus="0", instances=2, status="ready")
    Placement.objects.create(model=identity, server=server, gpus="1", instances=3, status="loading")
    Slot.objects.create(model=identity, state=SlotState.RUNNING, expires_at=now + timedelta(seconds=30))
    Slot.objects.create(model=identity, state=SlotState.QUEUED, expires_at=now + timedelta(seconds=30))

    written = samples_take(now=now)

    samples = {s.model: s for s in ModelSample.objects.all()}
    assert written == len(samples) + 2  # one per catalogue model, one per server
    s = samples["identity"]
    assert (s.runnable_shards, s.runnable_lines, s.running_shards) == (1, 4, 1)
    assert (s.lines_completed, s.lines_failed, s.shards_finished) == (7, 1, 2)
    assert s.interval_seconds == pytest.approx(15.0)  # the first tick looks back one sample interval
    assert (s.shard_p50_seconds, s.shard_p95_seconds, s.shard_p99_seconds) == pytest.approx((1.0, 3.0, 3.0))
    # Two ready instances (the loading placement does not count) at 6 calls each, 3 calls per shard: 4 slots.
    assert (s.instances, s.slot_cap, s.slots_running) == (2, 4, 1)
    idle = samples["scale2"]
    assert (idle.runnable_lines, idle.lines_completed, idle.shard_p50_seconds) == (0, 0, None)
    servers = {s.server: s for s in ServerSample.objects.all()}
    assert (servers["triton-a"].instances, servers["triton-a"].running_shards) == (2, 1)
    assert servers["triton-a"].gpu_utilization == pytest.approx(0.6)
    assert (servers["triton-b"].instances, servers["triton-b"].gpu_utilization) == (0, None)


def test_ticks_chain_their_intervals_and_a_paused_model_holds_its_queue(busy_identity):
    now = busy_identity
    samples_take(now=now)
    CatalogueModel.objects.filter(name="identity").update(paused=True)
    later = now + timedelta(seconds=20)
    samples_take(now=later)
    second = ModelSample.objects.get(model="identity", taken_at=later)
    assert second.interval_seconds == pytest.approx(20.0)
    assert (second.lines_completed, second.shards_finished, second.shard_p50_seconds) == (0, 0, None)
    assert (second.runnable_shards, second.running_shards) == (0, 1)


def test_old_samples_are_pruned(busy_identity, settings):
    now = busy_identity
    samples_take(now=now - timedelta(days=9))
    assert ModelSample.objects.exists()
    samples_take(now=now)
    assert set(ModelSample.objects.values_list("taken_at", flat=True)) == {now}
    assert set(ServerSample.objects.values_list("taken_at", flat=True)) <= {now}


def test_dashboard_series_from_ticks(busy_identity):
    now = busy_identity
    for i in range(4):
        samples_take(now=now - timedelta(minutes=3 - i))  # the last tick at `now` sees the two finished shards
    data = dashboard(window="1h", now=now + timedelta(seconds=1))
    assert data.bucket_seconds == bucket_seconds_for(timedelta(hours=1)) == 30
    queue = {s.name: s for s in data.queue_lines}
    assert [y for _, y in queue["identity"].points] == [4.0, 4.0, 4.0, 4.0]
    throughput = {s.name: s for s in data.throughput}
    # 8 lines over the last tick's 60 s interval.
    assert throughput["identity"].points[-1][1] == pytest.approx(8 / 60)
    assert list(data.latency) == ["identity"]
    p50, p95, p99 = data.latency["identity"]
    assert (p50.name, p50.points[-1][1], p95.points[-1][1]) == ("p50", 1.0, 3.0)
    assert p99.points[0][1] is None  # no shard finished in the first ticks: a gap, not a zero
    assert data.gpu_utilisation == []  # no server exports utilisation
    week = dashboard(window="7d", now=now + timedelta(seconds=1))
    assert week.bucket_seconds == 5040 and len({s.name for s in week.queue_lines}) == len(queue)
