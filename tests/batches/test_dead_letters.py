"""Faults and dead letters through the services with fake backends: infrastructure faults (Triton down, a
model that will not load, a lost worker) spend no attempts; content failures do, up to a dead letter,
which an operator can requeue while its batch is open. Leases are kept by a keeper thread."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.batches.shards import shard_requeue, shards_rescue
from controlplane.core.http.errors import Conflict
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.claims import shard_claim_next
from controlplane.triton.client import PermanentTritonError, TransientTritonError
from tests.batches.test_lifecycle import _create
from tests.support.batches import embedding_line, file_records
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(settings, monkeypatch) -> list[tuple[str, list]]:
    messages: list[tuple[str, list]] = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: messages.append((task_name, args)))
    settings.SHARD_MAX_LINES = 4
    return messages


class CrashingBackend(FakeBackend):
    """Processing the shard's data raises something unexpected: a content failure."""

    def infer(self, triton_model, inputs, output_names):
        raise RuntimeError("model output had an impossible shape")


def _validated(tenant, count: int) -> Batch:
    batch = _create(tenant, [embedding_line(f"r{i}", f"text {i}") for i in range(count)])
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def _run(shard: Shard, backend: FakeBackend) -> str:
    """Run the shard the scheduler serves next, which must be ``shard``."""
    return run_shard(shard, backend, owner="t")


def _backoff_passes(shard: Shard) -> None:
    """A released shard waits in its row (not_before) before a slot may claim it again; let that time pass."""
    Shard.objects.filter(id=shard.id).update(not_before=timezone.now() - timedelta(seconds=1))


def _claim(owner: str) -> Shard | None:
    return shard_claim_next(model=CatalogueModel.objects.get(name="all-MiniLM-L6-v2"), owner=owner)


def test_content_failures_spend_attempts_and_end_in_a_dead_letter(tenant, sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 2
    batch = _validated(tenant, 3)
    shard = Shard.objects.get(batch=batch)
    assert _run(shard, CrashingBackend()) == "retry"
    shard.refresh_from_db()
    assert (shard.status, shard.content_failures, shard.attempt) == (ShardStatus.PENDING, 1, 1)
    _backoff_passes(shard)
    assert _run(shard, CrashingBackend()) == "dead"
    shard.refresh_from_db()
    assert (shard.status, shard.content_failures) == (ShardStatus.DEAD, 2)
    assert "RuntimeError: model output had an impossible shape" in shard.last_error
    # Its lines are still reported, once each, as failed.
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (0, 3)
    errors = file_records(batch.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(f"r{i}", "internal_error") for i in range(3)]


def test_a_model_that_will_not_load_spends_nothing(tenant, sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1

    class Unloadable(FakeBackend):
        def prepare(self, triton_model):
            raise PermanentTritonError("failed to load 'minilm': model.py raised ImportError")

    batch = _validated(tenant, 2)
    shard = Shard.objects.get(batch=batch)
    for _ in range(3):
        assert _run(shard, Unloadable()) == "deferred"  # back to pending, for free: the slot ends
        _backoff_passes(shard)
    shard.refresh_from_db()
    assert (shard.status, shard.content_failures) == (ShardStatus.PENDING, 0)
    assert "could not be prepared" in shard.last_error


def test_a_lost_worker_spends_nothing(tenant, sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = _validated(tenant, 2)
    shard = Shard.objects.get(batch=batch)
    for attempt in range(1, 4):  # three workers die holding it
        claimed = _claim(f"w{attempt}")
        assert claimed is not None and claimed.id == shard.id
        Shard.objects.filter(id=shard.id).update(lease_expires_at="2000-01-01T00:00:00Z")
        assert shards_rescue() == [shard.id]
    shard.refresh_from_db()
    assert (shard.status, shard.attempt, shard.content_failures) == (ShardStatus.PENDING, 3, 0)
    assert _run(shard, FakeBackend()) == "succeeded"
    assert Batch.objects.get(id=batch.id).completed_lines == 2


def test_a_shard_that_loses_every_worker_becomes_a_dead_letter(tenant, sent, settings):
    settings.SHARD_MAX_LEASE_EXPIRIES = 3
    batch = _validated(tenant, 2)
    shard = Shard.objects.get(batch=batch)
    for attempt in range(1, 4):
        claimed = _claim(f"w{attempt}")
        assert claimed is not None and claimed.id == shard.id
        Shard.objects.filter(id=shard.id).update(lease_expires_at="2000-01-01T00:00:00Z")
        runnable = shards_rescue()
        assert runnable == ([shard.id] if attempt < 3 else [])
    shard.refresh_from_db()
    assert (shard.status, shard.lease_expiries, shard.content_failures) == (ShardStatus.DEAD, 3, 0)
    assert shard.last_error == "lease expired 3 times: every worker that ran this shard was lost"
    assert (dispatch.FINALIZE, [batch.id]) in sent
    # An operator who fixed the cause (more memory) gives it both budgets back.
    requeued = shard_requeue(shard_id=shard.id, actor="ops")
    assert (requeued.status, requeued.lease_expiries) == (ShardStatus.PENDING, 0)
    assert _run(shard, FakeBackend()) == "succeeded"
    assert Batch.objects.get(id=batch.id).completed_lines == 2


def test_dead_shard_is_requeued_while_its_batch_is_open(tenant, sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = _validated(tenant, 8)  # two shards
    first, second = Shard.objects.filter(batch=batch).order_by("index")
    assert _run(first, CrashingBackend()) == "dead"
    assert Batch.objects.get(id=batch.id).status == BatchStatus.IN_PROGRESS  # the second is still pending
    sent.clear()
    requeued = shard_requeue(shard_id=first.id, actor="ops")
    assert (requeued.status, requeued.content_failures, requeued.attempt) == (ShardStatus.PENDING, 0, 1)
    assert (dispatch.TOPUP, [batch.model]) in sent
    event = BatchEvent.objects.get(batch=batch, kind="shard_requeued")
    assert event.shard_index == 0 and "by ops" in event.message and "RuntimeError" in event.message
    with pytest.raises(Conflict, match="not dead"):
        shard_requeue(shard_id=first.id, actor="ops")
    assert _run(first, FakeBackend()) == "succeeded"
    assert attempt_of(first) == 2  # the fencing token kept growing
    assert _run(second, FakeBackend()) == "succeeded"
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (8, 0)


def attempt_of(shard: Shard) -> int:
    return Shard.objects.get(id=shard.id).attempt


def test_dead_shard_of_a_finished_or_stopping_batch_cannot_be_requeued(tenant, sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = _validated(tenant, 8)
    first, _second = Shard.objects.filter(batch=batch).order_by("index")
    assert _run(first, CrashingBackend()) == "dead"
    services.batch_cancel(batch=batch)
    with pytest.raises(Conflict, match="cancelling"):
        shard_requeue(shard_id=first.id, actor="ops")
    batch_try_finalize(batch_id=batch.id)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED
    with pytest.raises(Conflict, match="cancelled"):
        shard_requeue(shard_id=first.id, actor="ops")
    # The dead shard's lines failed before the cancel: internal_error, the skipped ones batch_cancelled.
    codes = [(e["custom_id"], e["error"]["code"]) for e in file_records(batch.error_file_id)]
    assert codes == [(f"r{i}", "internal_error") for i in range(4)] + [
        (f"r{i}", "batch_cancelled") for i in range(4, 8)
    ]


def test_a_cancel_during_an_outage_completes(tenant, sent):
    batch = _validated(tenant, 4)
    shard = Shard.objects.get(batch=batch)

    class CancelledDuringOutage(FakeBackend):
        def infer(self, triton_model, inputs, output_names):
            services.batch_cancel(batch=Batch.objects.get(id=batch.id))
            raise TransientTritonError("fake: server unavailable")

    assert _run(shard, CancelledDuringOutage()) == "skipped"
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED
    assert {e["error"]["code"] for e in file_records(batch.error_file_id)} == {"batch_cancelled"}


def test_rescuer_closes_a_pending_shard_of_a_stopping_batch(tenant, sent):
    batch = _validated(tenant, 4)
    shard = Shard.objects.get(batch=batch)
    services.batch_cancel(batch=batch)
    # A worker released it just after the cancel had skipped the pending shards: nothing would claim it.
    Shard.objects.filter(id=shard.id).update(status=ShardStatus.PENDING, finished_at=None)
    shards_rescue()
    assert Shard.objects.get(id=shard.id).status == ShardStatus.SKIPPED
    assert (dispatch.FINALIZE, [batch.id]) in sent


def test_the_lease_is_kept_while_the_model_loads(tenant, sent, settings):
    settings.SHARD_LEASE_SECONDS = 1
    batch = _validated(tenant, 2)
    shard = Shard.objects.get(batch=batch)

    class SlowLoad(FakeBackend):
        def prepare(self, triton_model):
            time.sleep(2.5)  # longer than the lease: only the keeper's renewals keep it
            assert shards_rescue() == []  # the rescuer finds nothing expired

    assert _run(shard, SlowLoad()) == "succeeded"
    assert Shard.objects.get(id=shard.id).attempt == 1
    assert not BatchEvent.objects.filter(batch=batch, kind__startswith="shard_rescued").exists()


def test_admin_lists_dead_letters_and_requeues_them(tenant, sent, settings, admin_client):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = _validated(tenant, 8)
    first = Shard.objects.get(batch=batch, index=0)
    assert _run(first, CrashingBackend()) == "dead"
    page = admin_client.get("/admin/batches/shard/?dead=open")
    assert page.status_code == 200
    body = page.content.decode()
    assert f"{batch.id}#0" in body and f"{batch.id}#1" not in body
    assert "impossible shape" in body
    response = admin_client.post(
        "/admin/batches/shard/", {"action": "requeue_dead_shards", "_selected_action": [first.id]}, follow=True
    )
    assert "Requeued 1 shard(s)." in response.content.decode()
    assert Shard.objects.get(id=first.id).status == ShardStatus.PENDING
