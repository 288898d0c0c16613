"""The attempt is the fencing token (batches/shards.py): a worker presumed dead whose shard was rescued and
claimed again can renew, release or commit nothing. Each test fails when the ``attempt=`` condition of that
one write is removed: the stale worker's call would then match the row the current attempt holds.

Finalization has its fence too (batches/results/finalize.py): a finalizer presumed dead is restarted, and
only one of the two may finish the batch (``status=FINALIZING`` in transitions.batch_finish); the slower
one leaves no file, row or event behind. Nor can a finalization and an operator's requeue of a dead shard both
win: the finalizer checks for open shards again under the batch row lock that the requeue takes."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.batches.results import finalize
from controlplane.batches.shards import (
    PartSummary,
    shard_commit,
    shard_release,
    shard_renew,
    shard_requeue,
    shards_rescue,
)
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.services import file_delete
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.scheduling.claims import shard_claim_next
from controlplane.usage.models import UsageRecord
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def taken_over(settings, monkeypatch, catalogue) -> tuple[Shard, Shard]:
    """A one-shard batch whose first worker (attempt 1) was presumed dead and whose shard the rescuer gave to a
    second worker (attempt 2, running): the first one's handle and the second one's."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    runnable_batch(new_tenant("fenced"), 2)
    model = CatalogueModel.objects.get(name="identity")
    stale = shard_claim_next(model=model, owner="w1")
    assert stale is not None and stale.attempt == 1
    Shard.objects.filter(id=stale.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert shards_rescue() == [stale.id]
    current = shard_claim_next(model=model, owner="w2")
    assert current is not None and (current.id, current.attempt) == (stale.id, 2)
    return stale, current


def _row(shard: Shard) -> Shard:
    return Shard.objects.get(id=shard.id)


def test_a_stale_attempt_cannot_renew_the_lease(taken_over):
    stale, current = taken_over
    before = _row(current).lease_expires_at
    assert shard_renew(shard_id=stale.id, attempt=stale.attempt) is False  # its keeper stops the stale run
    assert _row(current).lease_expires_at == before
    assert shard_renew(shard_id=current.id, attempt=current.attempt) is True
    assert _row(current).lease_expires_at > before


@pytest.mark.parametrize("content_failure", [True, False])
def test_a_stale_attempt_cannot_release_the_shard(taken_over, content_failure):
    stale, current = taken_over
    outcome = shard_release(
        shard_id=stale.id, attempt=stale.attempt, error="RuntimeError: stale", content_failure=content_failure
    )
    assert outcome is None  # the lease was lost: nothing changes
    row = _row(current)
    assert (row.status, row.attempt, row.lease_owner) == (ShardStatus.RUNNING, 2, "w2")
    assert (row.content_failures, row.last_error, row.not_before) == (0, "lease expired: worker lost", None)
    assert not BatchEvent.objects.filter(batch_id=row.batch_id, kind__startswith="shard_released").exists()
    # The current attempt can.
    assert shard_release(shard_id=current.id, attempt=2, error="x", content_failure=False) == ShardStatus.PENDING


def test_a_stale_attempt_cannot_commit_its_part(taken_over):
    stale, current = taken_over
    stale_part = PartSummary(part_name="parts/stale", completed=2, failed=0, tokens=TokenCounts(), stopped=False)
    assert shard_commit(shard_id=stale.id, attempt=stale.attempt, summary=stale_part) is False
    row = _row(current)
    assert (row.status, row.part_name, row.completed_lines) == (ShardStatus.RUNNING, "", 0)
    assert Batch.objects.get(id=row.batch_id).completed_lines == 0
    assert not UsageRecord.objects.filter(batch_id=row.batch_id).exists()
    current_part = PartSummary(part_name="parts/current", completed=2, failed=0, tokens=TokenCounts(), stopped=False)
    assert shard_commit(shard_id=current.id, attempt=current.attempt, summary=current_part) is True
    assert (_row(current).status, _row(current).part_name) == (ShardStatus.SUCCEEDED, "parts/current")
    assert UsageRecord.objects.filter(batch_id=row.batch_id).count() == 1


def test_a_finalizer_overtaken_by_its_restart_leaves_nothing_behind(settings, monkeypatch, catalogue, storage_dir):
    """The slot that closed the last shard finalizes; it is slow, so the rescuer presumes it dead and restarts
    finalization, which finishes first. The slow one's batch_finish must lose: its result files are deleted,
    its File rows and events rolled back, and the batch keeps the restart's files."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    settings.FINALIZE_STALE_SECONDS = 60
    batch = runnable_batch(new_tenant("finalizers"), 4)
    first, last = Shard.objects.filter(batch=batch).order_by("index")
    assert run_shard(first, FakeBackend()) == "succeeded"

    real_finish = finalize.batch_finish
    calls: list[str] = []
    restarted: list[list[str]] = []

    def rescuer() -> None:
        """Another process's beat, on its own connection: the slow finalizer's transaction is still open."""
        try:
            Batch.objects.filter(id=batch.id).update(finalizing_at=timezone.now() - timedelta(seconds=61))
            restarted.append(finalize.batches_finalize_stuck())
            finalize.batch_finalize(batch_id=batch.id)  # the control worker takes the restart the rescuer sent
        finally:
            connection.close()

    def slow_finish(**kwargs):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:  # the slot's finalizer, about to finish: the restart overtakes it
            thread = threading.Thread(target=rescuer)
            thread.start()
            thread.join(60)
            assert restarted == [[batch.id]], "the rescuer did not restart and finish the finalization"
        return real_finish(**kwargs)

    monkeypatch.setattr(finalize, "batch_finish", slow_finish)
    assert run_shard(last, FakeBackend()) == "succeeded"  # the last commit finalizes, slowly
    assert len(calls) == 2  # the slot's finalizer and the restart each reached the finish

    batch.refresh_from_db()
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.COMPLETED, 4, 0)
    assert BatchEvent.objects.filter(batch=batch, kind=BatchStatus.COMPLETED).count() == 1
    outputs = File.objects.filter(purpose=File.Purpose.BATCH_OUTPUT, filename__startswith=batch.id)
    assert list(outputs.values_list("id", flat=True)) == [batch.output_file_id]
    blobs = sorted(path.name for path in (storage_dir / "results").rglob("*.jsonl"))
    assert blobs == [outputs.get().storage_name.rsplit("/", 1)[1]], "the losing finalizer's blob is left behind"


def test_a_finalizer_that_finds_its_batch_finished_reads_nothing(settings, monkeypatch, catalogue, storage_dir):
    """A finalizer that moved its batch to finalizing may stall past FINALIZE_STALE_SECONDS: the restart finishes
    the batch, whose tenant may then delete the input file. When the stalled one goes on, it stops at the
    batch's status rather than read the parts and the input again (the input is gone: that would fail)."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    batch = runnable_batch(new_tenant("stalled"), 4)
    services.batch_cancel(batch=batch)  # both shards are skipped: their lines are read from the input
    assert finalize.batch_try_finalize(batch_id=batch.id) is True  # the restart
    file_delete(file=File.objects.get(id=batch.input_file_id))
    finished, stored = Batch.objects.get(id=batch.id), sorted(storage_dir.rglob("*"))
    finalize.batch_finalize(batch_id=batch.id)  # the stalled finalizer goes on
    assert sorted(storage_dir.rglob("*")) == stored
    batch.refresh_from_db()
    assert (batch.status, batch.error_file_id) == (BatchStatus.CANCELLED, finished.error_file_id)


def _wait_until_this_transaction_is_waited_for(seconds: float = 60) -> bool:
    """Whether another session came to wait for a lock this transaction holds (Postgres' pg_locks: a waiter
    on a row lock waits on the holder's transaction id), polled until ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted"
                " AND transactionid::text::bigint = txid_current() % 4294967296)"
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.01)
    return False


@pytest.mark.row_locks
def test_a_shard_requeued_while_the_finalizer_waits_for_the_batch_row_keeps_the_batch_open(
    settings, monkeypatch, catalogue
):
    """The batch's one shard is dead, so the finalizer sees no open shard; an operator requeues it meanwhile,
    under the batch row lock, and commits once the finalizer waits for that lock. Checking again under the lock,
    the finalizer leaves the batch open: the requeued shard is not left pending in a finished batch."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)  # the rescuer's finalize message is lost
    settings.SHARD_MAX_LINES = 2
    settings.SHARD_MAX_LEASE_EXPIRIES = 1
    batch = runnable_batch(new_tenant("requeued"), 2)
    shard = shard_claim_next(model=CatalogueModel.objects.get(name="identity"), owner="w1")
    assert shard is not None
    Shard.objects.filter(id=shard.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    shards_rescue()
    assert _row(shard).status == ShardStatus.DEAD
    requeued, waited = threading.Event(), []

    def operator() -> None:
        try:
            with transaction.atomic():
                shard_requeue(shard_id=shard.id, actor="ops")
                requeued.set()
                waited.append(_wait_until_this_transaction_is_waited_for())
        finally:
            connection.close()

    thread = threading.Thread(target=operator)
    thread.start()
    try:
        assert requeued.wait(60)
        assert finalize.batch_try_finalize(batch_id=batch.id) is False
    finally:
        thread.join(60)
    assert waited == [True], "the finalizer never waited for the batch row"
    assert Batch.objects.get(id=batch.id).status == BatchStatus.IN_PROGRESS
    assert _row(shard).status == ShardStatus.PENDING
