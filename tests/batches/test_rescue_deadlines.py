"""The rescuer's deadlines, one per non-terminal state, driven through the services: a batch stuck in
validating is validated again and failed after a few attempts; a finalizer that died is restarted; a lost
part file becomes ``part_lost`` lines instead of a finalization retried forever; a cancelling batch whose
worker died is closed and finalized."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches import services, tasks
from controlplane.batches.intake import validation_rescue, verdict
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batches_finalize_stuck
from controlplane.core.messaging import dispatch
from controlplane.files.storage import blob_delete
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.claims import shard_claim_next
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
    settings.BATCH_VALIDATION_DEADLINE_SECONDS = 60
    settings.FINALIZE_STALE_SECONDS = 60
    return messages


def _lines(count: int) -> list[dict]:
    return [embedding_line(f"r{i}", f"text {i}") for i in range(count)]


def _age(batch: Batch, seconds: float = 120) -> None:
    """Make every past attempt of the batch older than the deadlines."""
    past = timezone.now() - timedelta(seconds=seconds)
    Batch.objects.filter(id=batch.id).update(created_at=past)
    Batch.objects.filter(id=batch.id, validation_started_at__isnull=False).update(validation_started_at=past)
    Batch.objects.filter(id=batch.id, validation_waiting_at__isnull=False).update(validation_waiting_at=past)
    BatchEvent.objects.filter(batch_id=batch.id).update(created_at=past)


def _validated(tenant, count: int) -> Batch:
    batch = _create(tenant, _lines(count))
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def _run(shard: Shard) -> str:
    """Run the shard the scheduler serves next, which must be ``shard``."""
    return run_shard(shard, FakeBackend(), owner="t")


def _deliver_finalizes(sent: list[tuple[str, list]]) -> None:
    """The control worker takes the finalize messages sent so far (the rescuer only sends them)."""
    for task_name, args in list(sent):
        if task_name == dispatch.FINALIZE:
            sent.remove((task_name, args))
            tasks.batch_finalize_task(*args)


def _claim(shard: Shard, owner: str) -> None:
    """A worker claims the shard the scheduler serves next, which must be ``shard``."""
    claimed = shard_claim_next(model=CatalogueModel.objects.get(name="all-MiniLM-L6-v2"), owner=owner)
    assert claimed is not None and claimed.id == shard.id


# --- validating -------------------------------------------------------------------------------------------


def test_validating_within_its_deadline_is_left_alone(tenant, sent):
    batch = _create(tenant, _lines(2))
    sent.clear()
    assert validation_rescue.batches_validation_rescue() == []
    assert sent == []
    assert Batch.objects.get(id=batch.id).status == BatchStatus.VALIDATING


def test_lost_validation_is_enqueued_again_and_the_retry_completes_it(tenant, sent):
    batch = _create(tenant, _lines(2))  # its validate message is lost: nobody runs it
    _age(batch)
    sent.clear()
    assert validation_rescue.batches_validation_rescue() == [batch.id]
    assert sent == [(dispatch.VALIDATE, [batch.id])]
    event = BatchEvent.objects.get(batch=batch, kind="validation_retried")
    assert "attempt 2 of 3" in event.message
    # The deadline now counts from the retry: a second pass right away does nothing.
    assert validation_rescue.batches_validation_rescue() == []
    services.batch_validate(batch_id=batch.id)  # the retried message is delivered
    assert Batch.objects.get(id=batch.id).status == BatchStatus.IN_PROGRESS
    services.batch_validate(batch_id=batch.id)  # a late duplicate is a no-op
    assert Shard.objects.filter(batch=batch).count() == 1
    _age(batch)
    assert validation_rescue.batches_validation_rescue() == []


def test_validation_that_never_finishes_fails_after_three_attempts(tenant, sent):
    batch = _create(tenant, _lines(2))
    for attempt in (2, 3):
        _age(batch)
        assert validation_rescue.batches_validation_rescue() == [batch.id]
        assert BatchEvent.objects.filter(batch=batch, kind="validation_retried").count() == attempt - 1
    assert sent.count((dispatch.VALIDATE, [batch.id])) == 3  # create + two retries
    _age(batch)
    assert validation_rescue.batches_validation_rescue() == [batch.id]
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.FAILED and batch.failed_at is not None
    [error] = batch.errors["data"]
    assert error["code"] == "validation_error"
    assert "did not finish after 3 attempts" in error["message"]
    assert validation_rescue.batches_validation_rescue() == []


def test_beat_rescuer_covers_validating(tenant, sent):
    batch = _create(tenant, _lines(2))
    _age(batch)
    sent.clear()
    tasks.shards_rescue_task()
    assert (dispatch.VALIDATE, [batch.id]) in sent


# --- finalizing -------------------------------------------------------------------------------------------


def test_missing_part_becomes_part_lost_lines_not_an_endless_retry(tenant, sent, caplog):
    batch = _validated(tenant, 8)  # two shards of four
    first, second = Shard.objects.filter(batch=batch).order_by("index")
    assert _run(first) == "succeeded"
    blob_delete(Shard.objects.get(id=first.id).part_name)  # storage loses the committed part
    assert _run(second) == "succeeded"  # the last commit finalizes
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert (batch.completed_lines, batch.failed_lines) == (4, 4)
    errors = file_records(batch.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(f"r{i}", "part_lost") for i in range(4)]
    assert "lost in storage" in errors[0]["error"]["message"]
    assert [o["custom_id"] for o in file_records(batch.output_file_id)] == [f"r{i}" for i in range(4, 8)]
    assert BatchEvent.objects.get(batch=batch, kind="part_lost").shard_index == 0
    # The log says which part and carries storage's own error, for whoever looks for where it went.
    [warning] = [record for record in caplog.records if "is lost" in record.getMessage()]
    assert warning.exc_info and warning.exc_info[0] is FileNotFoundError


def test_dead_finalizer_is_restarted_after_the_setting(tenant, sent, settings):
    batch = _validated(tenant, 4)
    [shard] = Shard.objects.filter(batch=batch)
    _claim(shard, "w")
    # The shard commits, then the finalizer dies after moving the batch to finalizing.
    Shard.objects.filter(id=shard.id).update(status=ShardStatus.SUCCEEDED, part_name="parts/never-written")
    Batch.objects.filter(id=batch.id).update(status=BatchStatus.FINALIZING, finalizing_at=timezone.now())
    assert batches_finalize_stuck() == []  # not stale yet
    Batch.objects.filter(id=batch.id).update(finalizing_at=timezone.now() - timedelta(seconds=61))
    assert batches_finalize_stuck() == [batch.id]
    assert Batch.objects.get(id=batch.id).status == BatchStatus.FINALIZING  # the control queue finalizes it
    assert (dispatch.FINALIZE, [batch.id, True]) in sent
    _deliver_finalizes(sent)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED
    assert [e["error"]["code"] for e in file_records(batch.error_file_id)] == ["part_lost"] * 4


# --- cancelling -------------------------------------------------------------------------------------------


def test_cancelling_batch_whose_worker_died_is_closed_and_finalized(tenant, sent):
    batch = _validated(tenant, 8)
    first, second = Shard.objects.filter(batch=batch).order_by("index")
    _claim(first, "w1")  # its worker dies holding it
    services.batch_cancel(batch=batch)
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLING
    assert Shard.objects.get(id=second.id).status == ShardStatus.SKIPPED
    tasks.shards_rescue_task()  # the lease has not expired: nothing to close yet
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLING
    Shard.objects.filter(id=first.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    tasks.shards_rescue_task()
    assert Shard.objects.get(id=first.id).status == ShardStatus.SKIPPED
    _deliver_finalizes(sent)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED
    errors = file_records(batch.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [(f"r{i}", "batch_cancelled") for i in range(8)]


def test_cancelling_batch_with_a_lost_finalize_message_is_finalized(tenant, sent):
    batch = _validated(tenant, 4)
    services.batch_cancel(batch=batch)  # the finalize message it sends is never delivered
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLING
    sent.clear()
    tasks.shards_rescue_task()
    _deliver_finalizes(sent)
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLED


def test_the_rescuer_finalizes_the_batches_whose_shards_are_all_closed_and_names_them(tenant, sent):
    lost = _validated(tenant, 4)
    services.batch_cancel(batch=lost)  # the finalize message it sends is never delivered
    running = _validated(tenant, 4)  # its shard is pending
    sent.clear()
    assert batches_finalize_stuck() == [lost.id]
    assert sent == [(dispatch.FINALIZE, [lost.id, True])]  # one message, taken: a second pass sends none
    _deliver_finalizes(sent)
    assert Batch.objects.get(id=lost.id).status == BatchStatus.CANCELLED
    assert Batch.objects.get(id=running.id).status == BatchStatus.IN_PROGRESS
    assert batches_finalize_stuck() == []


class _SlowStream:
    """Storage that takes ``seconds`` per line read: a validation that would outrun its deadline."""

    def __init__(self, stream, seconds: float):
        self._stream, self._seconds = stream, seconds

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._stream.close()

    def readline(self, size: int = -1) -> bytes:
        time.sleep(self._seconds)
        return self._stream.readline(size)


def test_a_validation_stops_itself_at_its_deadline_so_no_retry_runs_beside_it(tenant, sent, settings, monkeypatch):
    # The control worker runs Celery's thread pool, which ignores task time limits: the deadline is the
    # attempt's own. 2 s, stopping a tenth early; 40 lines at 0.1 s each would take 4 s.
    settings.BATCH_VALIDATION_DEADLINE_SECONDS = 2
    batch = _create(tenant, _lines(40))
    real_open = verdict.blob_open
    monkeypatch.setattr(verdict, "blob_open", lambda name: _SlowStream(real_open(name), 0.1))
    started = time.monotonic()
    services.batch_validate(batch_id=batch.id)
    assert time.monotonic() - started < 2.5
    assert Batch.objects.get(id=batch.id).status == BatchStatus.VALIDATING  # no verdict: the rescuer's turn
    # At the rescuer's deadline nothing is running any more; it retries, and the retry completes the batch.
    _age(batch)
    assert validation_rescue.batches_validation_rescue() == [batch.id]
    monkeypatch.setattr(verdict, "blob_open", real_open)
    services.batch_validate(batch_id=batch.id)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.IN_PROGRESS and batch.total_lines == 40
    assert Shard.objects.filter(batch=batch).count() == 10  # the stopped attempt's early shards were discarded
