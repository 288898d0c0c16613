"""The details of each shard write (batches/shards.py) that the flows of test_dead_letters.py, test_fences.py
and test_lifecycle.py leave open; each test kills mutants those flows let through (docs/reliability.md,
"Mutation testing"): how long a released shard waits, what a release and a rescue record, both budgets as
ceilings, a commit's running totals and a validating batch's ledger, the close of a stranded shard, and what a
requeue refuses and records. Shards are taken with the claim's own UPDATE (shard_claim_selected): the
scheduler's choice is not what these tests are about."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.intake.early_dispatch import shards_discard
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.batches.shards import (
    PartSummary,
    batch_stop_requested,
    shard_claim_selected,
    shard_commit,
    shard_release,
    shard_requeue,
    shard_skip_if_stopping,
    shards_rescue,
)
from controlplane.core.http.errors import Conflict
from controlplane.core.messaging import dispatch
from controlplane.kinds.base import TokenCounts
from controlplane.usage.models import UsageRecord
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(settings, monkeypatch, catalogue) -> list[tuple[str, list]]:
    messages: list[tuple[str, list]] = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: messages.append((task_name, args)))
    settings.SHARD_MAX_LINES = 2
    return messages


def _one_shard(name: str) -> Shard:
    return Shard.objects.get(batch=runnable_batch(new_tenant(name), 2))


def _claim(shard: Shard) -> Shard:
    claimed = shard_claim_selected(shard_id=shard.id, owner="w", now=timezone.now())
    assert claimed is not None
    return claimed


def _row(shard: Shard) -> Shard:
    return Shard.objects.get(id=shard.id)


def _summary(completed: int, failed: int, tokens: TokenCounts) -> PartSummary:
    return PartSummary(part_name="parts/p", completed=completed, failed=failed, tokens=tokens, stopped=False)


# --- release ---------------------------------------------------------------------------------------------


def test_a_released_shard_waits_a_second_doubling_per_attempt_up_to_four(sent):
    shard = _one_shard("backoff")
    for attempt, seconds in enumerate([1, 2, 4, 4], start=1):
        assert _claim(shard).attempt == attempt
        before = timezone.now()
        status = shard_release(shard_id=shard.id, attempt=attempt, error="unavailable", content_failure=False)
        after = timezone.now()
        row = _row(shard)
        assert (status, row.content_failures, row.finished_at) == (ShardStatus.PENDING, 0, None)
        # The release's own clock lies between the two readings, so the bound is exact, not a tolerance.
        wait = timedelta(seconds=seconds)
        assert before + wait <= row.not_before <= after + wait, (attempt, row.not_before - before)


def test_a_release_records_its_error_and_cause_and_when_a_dead_letter_closed(sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 2
    shard = _one_shard("errors")
    error = "E" * 3000  # a long traceback: the row keeps 2,000 characters, the event 500
    for attempt, content_failure, status in [(1, False, "pending"), (2, True, "pending"), (3, True, "dead")]:
        _claim(shard)
        before = timezone.now()
        assert shard_release(shard_id=shard.id, attempt=attempt, error=error, content_failure=content_failure) == status
        after = timezone.now()
    row = _row(shard)
    assert (row.last_error, row.content_failures) == ("E" * 2000, 2)
    assert (row.not_before, row.lease_owner, row.lease_expires_at) == (None, "", None)
    assert before <= row.finished_at <= after
    events = BatchEvent.objects.filter(batch_id=shard.batch_id, kind__startswith="shard_released").order_by("id")
    assert [(e.kind, e.message) for e in events] == [
        ("shard_released_pending", f"attempt 1 (infrastructure, no attempt spent): {'E' * 500}"),
        ("shard_released_pending", f"attempt 2 (content failure 1 of 2): {'E' * 500}"),
        ("shard_released_dead", f"attempt 3 (content failure 2 of 2): {'E' * 500}"),
    ]


def test_a_released_shard_of_a_stopping_batch_is_closed_as_skipped(sent):
    shard = _claim(_one_shard("stopping"))
    services.batch_cancel(batch=Batch.objects.get(id=shard.batch_id))  # the running shard is given back after
    before = timezone.now()
    status = shard_release(shard_id=shard.id, attempt=1, error="unavailable", content_failure=False)
    after = timezone.now()
    row = _row(shard)
    assert (status, row.not_before) == (ShardStatus.SKIPPED, None)
    assert before <= row.finished_at <= after


def test_a_shard_past_its_content_budget_dies_at_its_next_content_failure(sent, settings):
    """The budget is a ceiling, not a count to meet exactly: this shard failed 3 times under a limit of 5,
    which a redeploy then lowered to 2."""
    settings.SHARD_MAX_ATTEMPTS = 2
    shard = _one_shard("over-budget")
    Shard.objects.filter(id=shard.id).update(content_failures=3)
    _claim(shard)
    assert shard_release(shard_id=shard.id, attempt=1, error="boom", content_failure=True) == ShardStatus.DEAD
    assert _row(shard).content_failures == 4


# --- rescue ----------------------------------------------------------------------------------------------


def _expire(shard: Shard) -> None:
    Shard.objects.filter(id=shard.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_a_rescued_shard_is_runnable_again_with_no_finish_time(sent):
    shard = _claim(_one_shard("rescued"))
    _expire(shard)
    sent.clear()
    assert shards_rescue() == [shard.id]
    row = _row(shard)
    assert (row.status, row.lease_expiries, row.finished_at, row.not_before) == (ShardStatus.PENDING, 1, None, None)
    assert sent == [(dispatch.TOPUP, ["identity"])]


def test_a_rescued_shard_of_a_stopping_batch_is_skipped_and_its_batch_finalized(sent):
    shard = _claim(_one_shard("rescued-stopping"))
    services.batch_cancel(batch=Batch.objects.get(id=shard.batch_id))
    _expire(shard)
    sent.clear()
    before = timezone.now()
    assert shards_rescue() == []
    after = timezone.now()
    row = _row(shard)
    assert row.status == ShardStatus.SKIPPED and before <= row.finished_at <= after
    assert sent == [(dispatch.FINALIZE, [shard.batch_id])]


def test_a_shard_past_its_lease_budget_dies_when_its_lease_next_expires(sent, settings):
    """The same ceiling for lost workers: 3 expiries under a limit of 8, which a redeploy lowered to 2."""
    settings.SHARD_MAX_LEASE_EXPIRIES = 2
    shard = _one_shard("lost-again")
    Shard.objects.filter(id=shard.id).update(lease_expiries=3)
    _expire(_claim(shard))
    sent.clear()
    before = timezone.now()
    assert shards_rescue() == []
    after = timezone.now()
    row = _row(shard)
    assert (row.status, row.lease_expiries) == (ShardStatus.DEAD, 4)
    assert before <= row.finished_at <= after
    assert sent == [(dispatch.FINALIZE, [shard.batch_id])]


def test_a_rescue_leaves_alone_a_shard_its_slow_worker_gave_back_meanwhile(sent, monkeypatch):
    """The rescuer reads the expired shards first and then takes each with a conditional UPDATE: a worker that
    was only slow may release its shard in between, and the rescue must then neither record nor report it."""
    batch = runnable_batch(new_tenant("race"), 4)  # two shards
    for shard in Shard.objects.filter(batch=batch):
        _expire(_claim(shard))
    given_back: list[int] = []

    def send(task_name: str, args: list) -> None:
        if not given_back:  # the first rescue has committed (its top-up goes out): the other's worker releases
            [late] = Shard.objects.filter(batch=batch, status=ShardStatus.RUNNING)
            given_back.append(late.index)
            assert shard_release(shard_id=late.id, attempt=1, error="unavailable", content_failure=False)

    monkeypatch.setattr(dispatch, "send", send)
    [rescued] = shards_rescue()
    assert given_back == [1 - Shard.objects.get(id=rescued).index]
    rescues = BatchEvent.objects.filter(batch=batch, kind__startswith="shard_rescued")
    assert list(rescues.values_list("shard_index", flat=True)) == [1 - given_back[0]]


def test_a_stranded_pending_shard_of_a_stopping_batch_is_closed_once(sent):
    batch = runnable_batch(new_tenant("stranded"), 4)
    first = Shard.objects.get(batch=batch, index=0)

    def skipped_events() -> list[int | None]:
        return list(BatchEvent.objects.filter(batch=batch, kind="shard_skipped").values_list("shard_index", flat=True))

    assert batch_stop_requested(batch_id=batch.id) is False
    assert shard_skip_if_stopping(shard_id=first.id) is False  # its batch is not stopping
    assert (_row(first).status, skipped_events()) == (ShardStatus.PENDING, [])
    services.batch_cancel(batch=batch)
    assert batch_stop_requested(batch_id=batch.id) is True
    # A worker released it just after the cancel had skipped the pending shards: nothing would claim it.
    Shard.objects.filter(id=first.id).update(status=ShardStatus.PENDING, finished_at=None)
    sent.clear()
    assert shards_rescue() == []
    assert sent == [(dispatch.FINALIZE, [batch.id])]  # the rescue's own, not the cancel's
    assert (_row(first).status, skipped_events()) == (ShardStatus.SKIPPED, [0])
    assert shard_skip_if_stopping(shard_id=first.id) is False  # closed already
    assert skipped_events() == [0]


# --- commit ----------------------------------------------------------------------------------------------


def test_commits_add_their_lines_and_tokens_to_the_batch_totals(sent, settings):
    settings.SHARD_MAX_LINES = 4
    batch = runnable_batch(new_tenant("totals"), 8)  # two shards of four lines
    parts = [(3, 1, TokenCounts(input=7, output=11, cached=2, choices=3)), (2, 2, TokenCounts(5, 4, 1, 2))]
    shards = Shard.objects.filter(batch=batch).order_by("index")
    for shard, (completed, failed, tokens) in zip(shards, parts, strict=True):
        _claim(shard)
        assert shard_commit(shard_id=shard.id, attempt=1, summary=_summary(completed, failed, tokens)) is True
    totals = ("completed_lines", "failed_lines", "prompt_tokens", "completion_tokens", "cached_tokens")
    assert Batch.objects.values_list(*totals).get(id=batch.id) == (5, 3, 12, 15, 3)
    assert UsageRecord.objects.filter(batch_id=batch.id).count() == 2


def test_a_commit_while_its_batch_validates_counts_but_writes_no_ledger_row(sent):
    shard = _claim(_one_shard("early"))
    # Early dispatch: the shard ran while its file was still being validated (batches/intake/early_dispatch.py).
    Batch.objects.filter(id=shard.batch_id).update(status=BatchStatus.VALIDATING)
    assert shard_commit(shard_id=shard.id, attempt=1, summary=_summary(2, 0, TokenCounts(input=3))) is True
    assert _row(shard).status == ShardStatus.SUCCEEDED
    assert Batch.objects.get(id=shard.batch_id).completed_lines == 2
    assert not UsageRecord.objects.filter(batch_id=shard.batch_id).exists()  # the validation's end writes it


def test_a_commit_of_a_shard_its_batch_discarded_is_refused(sent):
    shard = _claim(_one_shard("discarded"))
    Batch.objects.filter(id=shard.batch_id).update(status=BatchStatus.VALIDATING)
    shards_discard(batch_id=shard.batch_id)  # the file proved invalid: the validation's end takes the shards
    assert shard_commit(shard_id=shard.id, attempt=1, summary=_summary(2, 0, TokenCounts())) is False
    assert Batch.objects.get(id=shard.batch_id).completed_lines == 0


# --- requeue ---------------------------------------------------------------------------------------------


def _dead(shard: Shard, error: str = "RuntimeError: bad rows") -> None:
    """One content failure is the whole budget (the caller sets SHARD_MAX_ATTEMPTS = 1)."""
    claimed = _claim(shard)
    status = shard_release(shard_id=shard.id, attempt=claimed.attempt, error=error, content_failure=True)
    assert status == ShardStatus.DEAD


def _refused(shard: Shard, state: str) -> None:
    batch_id = shard.batch_id
    with pytest.raises(Conflict, match=f"^Batch {re.escape(batch_id)} is {re.escape(state)}: "):
        shard_requeue(shard_id=shard.id, actor="ops")
    assert _row(shard).status == ShardStatus.DEAD


def test_a_requeue_records_who_asked_and_the_start_of_the_last_error(sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    shard = Shard.objects.get(batch=runnable_batch(new_tenant("requeued"), 4), index=0)
    error = "RuntimeError: " + "x" * 400
    _dead(shard, error)
    assert shard_requeue(shard_id=shard.id, actor="ops").status == ShardStatus.PENDING
    event = BatchEvent.objects.get(batch_id=shard.batch_id, kind="shard_requeued")
    assert event.message == f"by ops; last error: {error[:300]}"


def test_a_dead_shard_of_a_completed_batch_cannot_be_requeued(sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    shard = _one_shard("completed")
    _dead(shard)
    batch_try_finalize(batch_id=shard.batch_id)  # its only shard is closed: the batch completes
    assert Batch.objects.get(id=shard.batch_id).status == BatchStatus.COMPLETED
    _refused(shard, "completed")


def test_a_dead_shard_of_a_validating_or_stopping_batch_cannot_be_requeued(sent, settings):
    settings.SHARD_MAX_ATTEMPTS = 1
    batch = runnable_batch(new_tenant("not-open"), 4)
    shard = Shard.objects.get(batch=batch, index=0)
    _dead(shard)
    # Early dispatch runs shards before the file has proved valid, so one can die while its batch validates.
    Batch.objects.filter(id=batch.id).update(status=BatchStatus.VALIDATING)
    _refused(shard, "validating")
    Batch.objects.filter(id=batch.id).update(status=BatchStatus.IN_PROGRESS)
    services.batch_cancel(batch=batch)
    _refused(shard, "cancelling (cancel)")
