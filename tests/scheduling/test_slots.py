"""Dispatch slots on real Postgres: the cap holds under concurrent top-ups, the broker never gets more
messages than there is runnable work, lost messages expire, and slots run batches to completion."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.models import Slot, SlotState
from controlplane.scheduling.runner import slot_run
from controlplane.scheduling.slots import slot_start, slots_topup
from controlplane.tenants.models import Tenant
from tests.support.fakes import FakeBackend
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


class Broker:
    """Records what the dispatcher sends, in order, so a test can deliver it by hand."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list]] = []
        self._lock = threading.Lock()

    def send(self, task_name: str, args: list) -> None:
        with self._lock:
            self.messages.append((task_name, args))

    def drain(self, backend: FakeBackend, limit: int = 10_000) -> int:
        delivered = 0
        while self.messages and delivered < limit:
            task_name, args = self.messages.pop(0)
            delivered += 1
            if task_name == dispatch.SLOT:
                slot_run(slot_id=args[0], owner="test", backend_factory=lambda name: backend)
            elif task_name == dispatch.TOPUP:
                slots_topup(model_name=args[0])
            elif task_name == dispatch.FINALIZE:
                batch_try_finalize(batch_id=args[0])
        return delivered

    def count(self, task_name: str) -> int:
        return sum(1 for name, _ in self.messages if name == task_name)


@pytest.fixture
def broker(settings, monkeypatch, catalogue) -> Broker:
    fake = Broker()
    monkeypatch.setattr(dispatch, "send", fake.send)
    settings.SHARD_MAX_LINES = 2
    return fake


def _identity() -> CatalogueModel:
    return CatalogueModel.objects.get(name="identity")


def test_topup_queues_at_most_the_cap_and_no_more_than_the_work(broker, settings):
    settings.SCHEDULER_CALLS_PER_INSTANCE = 12  # one unmanaged server: 12 calls ÷ 3 per shard = 4 slots
    tenant = new_tenant("t")
    runnable_batch(tenant, 4)  # two shards
    broker.messages.clear()
    assert slots_topup(model_name="identity") == {"identity": 2}  # only two shards to run
    runnable_batch(tenant, 400, prefix="big")  # 200 more shards
    slots_topup(model_name="identity")
    assert Slot.objects.filter(model=_identity()).count() == 4
    assert broker.count(dispatch.SLOT) == 4  # a 200-shard backlog is four messages, not 200
    assert slots_topup(model_name="identity") == {}


def test_an_idle_fleets_topup_asks_the_database_twice_whatever_the_catalogue(broker, settings):
    """Beat tops up every few seconds: with no runnable shard it deletes expired slots and finds no model to serve
    (it once asked four or more questions per enabled model), and an expired slot of a model without work still goes."""
    from django.test.utils import CaptureQueriesContext

    settings.SCHEDULER_CALLS_PER_INSTANCE = 3
    assert CatalogueModel.objects.filter(is_enabled=True).count() >= 4
    stale = Slot.objects.create(model=_identity(), expires_at=timezone.now() - timedelta(seconds=1))
    with CaptureQueriesContext(connection) as queries:
        assert slots_topup() == {}
    statements = [query["sql"] for query in queries.captured_queries if query["sql"] not in ("BEGIN", "COMMIT")]
    assert len(statements) == 2, statements
    assert not Slot.objects.filter(id=stale.id).exists()
    runnable_batch(new_tenant("t"), 2)  # work for one model: that model alone is looked at, and served
    assert slots_topup() == {"identity": 1}


def test_concurrent_topups_never_exceed_the_cap(broker, settings):
    settings.SCHEDULER_CALLS_PER_INSTANCE = 9  # 3 slots
    runnable_batch(new_tenant("t"), 200)
    Slot.objects.all().delete()
    barrier = threading.Barrier(2)
    seen: list[int] = []

    def topper() -> None:
        try:
            for _ in range(100):
                barrier.wait()
                slots_topup(model_name="identity")
                seen.append(Slot.objects.filter(model=_identity()).count())
                barrier.wait()
                Slot.objects.filter(model=_identity()).delete()  # both delete: idempotent
        finally:
            connection.close()

    threads = [threading.Thread(target=topper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 200 and max(seen) == 3


def test_a_lost_message_frees_its_slot_after_it_expires(broker, settings):
    settings.SCHEDULER_CALLS_PER_INSTANCE = 3  # one slot
    runnable_batch(new_tenant("t"), 10)
    slots_topup(model_name="identity")
    [slot] = Slot.objects.filter(model=_identity())
    assert slots_topup(model_name="identity") == {}  # the cap is taken by the (lost) queued slot
    Slot.objects.filter(id=slot.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert slots_topup(model_name="identity") == {"identity": 1}
    assert slot_start(slot_id=slot.id, owner="late") is None  # the late message does nothing


def test_slots_run_every_batch_to_completion_exactly_once(broker, settings):
    tenants = [new_tenant(f"t{i}") for i in range(3)]
    batches = [runnable_batch(t, 11, prefix=f"b{i}-") for i, t in enumerate(tenants)]
    backend = FakeBackend()
    broker.drain(backend)
    for batch in batches:
        batch = Batch.objects.get(id=batch.id)
        assert batch.status == BatchStatus.COMPLETED
        assert (batch.completed_lines, batch.failed_lines) == (11, 0)
    assert not Slot.objects.exists()
    assert sum(len(call["INPUT0"]) for call in backend.calls) == 33  # every row ran once


def test_paused_tenant_waits_and_resumes_without_loss(broker):
    tenant = new_tenant("pausable")
    batch = runnable_batch(tenant, 8)
    Tenant.objects.filter(id=tenant.id).update(paused=True)
    broker.drain(FakeBackend())
    assert Shard.objects.filter(batch=batch, status=ShardStatus.PENDING).count() == 4
    assert not Slot.objects.exists()
    Tenant.objects.filter(id=tenant.id).update(paused=False)
    slots_topup(model_name="identity")
    broker.drain(FakeBackend())
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == 8


def test_unavailable_backend_defers_in_the_database(broker, settings):
    settings.SCHEDULER_CALLS_PER_INSTANCE = 3
    batch = runnable_batch(new_tenant("t"), 2)
    broker.drain(FakeBackend(transient_failures=10_000))
    shard = Shard.objects.get(batch=batch)
    assert shard.status == ShardStatus.PENDING and shard.not_before is not None
    assert shard.not_before > timezone.now()  # waits in the row, not in a Celery countdown
    assert not Slot.objects.filter(state=SlotState.QUEUED).exists()  # nothing runnable: nothing queued


def test_a_shard_that_crashes_dies_alone(broker, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = runnable_batch(new_tenant("t"), 4)  # two shards

    def crash_first_call(calls: int) -> None:
        if calls == 1:
            raise RuntimeError("unexpected output")

    broker.drain(FakeBackend(on_call=crash_first_call))
    statuses = sorted(Shard.objects.filter(batch=batch).values_list("status", flat=True))
    assert statuses == [ShardStatus.DEAD, ShardStatus.SUCCEEDED]
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (2, 2)
