"""The shard state machine's one writer: claims, leases, commits, releases, skips, rescues and dead letters.
Every write of a shard's ``status`` is a function here (tests/batches/test_state_writers.py fails when one is
written anywhere else), and each records its BatchEvent. Every write is a conditional UPDATE; ``attempt`` is
the fencing token, so a worker that lost its lease can never overwrite the work of the one that took over.

    pending ──claim──► running ──commit──► succeeded / stopped
       ▲                  │ release (content failures spend the budget; at its end: dead)
       └──────────────────┘ rescue (lease expired)       pending / running of a stopping batch ──► skipped

Only failures caused by a shard's own content spend its budget (``content_failures`` against
SHARD_MAX_ATTEMPTS); infrastructure faults (Triton down or restarting, no capacity, a lost worker) release
it for free. A shard whose content failed too often is a dead letter (``dead``) until an operator requeues
it (``shard_requeue``) or its batch finalizes and reports its lines as ``internal_error``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.transitions import event_record
from controlplane.batches.usage_rows import shard_usage_from_row
from controlplane.core.http.errors import Conflict, NotFound
from controlplane.core.messaging import dispatch
from controlplane.core.workers.deadlines import job_time_up
from controlplane.kinds.base import TokenCounts
from controlplane.usage.services import usage_record_shard

logger = logging.getLogger(__name__)


def _lease_until() -> datetime:
    return timezone.now() + timedelta(seconds=settings.SHARD_LEASE_SECONDS)


def shard_claim_selected(*, shard_id: int, owner: str, now: datetime) -> Shard | None:
    """Take the pending shard the scheduler selected by policy (scheduling/claims.py), in its transaction and
    under its row lock: attempt + 1 (the new fencing token), a fresh lease. None when the shard is no longer
    pending — SQLite has no row locks, and a caller that selected without one must not take a running shard
    from its worker."""
    won = Shard.objects.filter(id=shard_id, status=ShardStatus.PENDING).update(
        status=ShardStatus.RUNNING,
        attempt=F("attempt") + 1,
        lease_owner=owner,
        not_before=None,
        lease_expires_at=now + timedelta(seconds=settings.SHARD_LEASE_SECONDS),
        started_at=now,
    )
    if won != 1:
        return None
    shard = Shard.objects.select_related("batch", "batch__tenant").get(id=shard_id)
    event_record(
        batch_id=shard.batch_id,
        shard_index=shard.index,
        kind="shard_claimed",
        message=f"attempt {shard.attempt} by {owner}",
    )
    return shard


def shards_skip_pending(*, batch_id: str) -> int:
    """A batch stops (cancel, expiry): its pending shards close as ``skipped`` without running (their lines
    become batch_cancelled / batch_expired); running ones stop between calls. In the stop's transaction."""
    return Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING).update(
        status=ShardStatus.SKIPPED, finished_at=timezone.now(), lease_expires_at=None, not_before=None
    )


def shard_skip_if_stopping(*, shard_id: int) -> bool:
    """A pending shard of a cancelled/expired batch is closed without running (e.g. released after a
    transient error just as the batch was cancelled). True when this call closed it."""
    with transaction.atomic():
        won = Shard.objects.filter(id=shard_id, status=ShardStatus.PENDING, batch__stop_reason__isnull=False).update(
            status=ShardStatus.SKIPPED, finished_at=timezone.now(), lease_expires_at=None
        )
        if won == 1:
            shard = Shard.objects.only("batch_id", "index").get(id=shard_id)
            event_record(batch_id=shard.batch_id, shard_index=shard.index, kind="shard_skipped")
    return won == 1


def shard_renew(*, shard_id: int, attempt: int) -> bool:
    """Extend the lease; False means the lease was lost and the caller must stop without committing."""
    return (
        Shard.objects.filter(id=shard_id, attempt=attempt, status=ShardStatus.RUNNING).update(
            lease_expires_at=_lease_until()
        )
        == 1
    )


def batch_stop_requested(*, batch_id: str) -> bool:
    return Batch.objects.filter(id=batch_id, stop_reason__isnull=False).exists()


@dataclass(frozen=True)
class PartSummary:
    part_name: str
    completed: int
    failed: int
    tokens: TokenCounts  # what the model counted for the completed lines
    stopped: bool  # True when cancel/expiry interrupted the shard: the part holds only some lines
    # The share of `completed` and `tokens` that ran with LoRA adapters, by the name the lines used
    # (`base:adapter`): [completed, input, output, cached, choices] each; None when no line named one.
    adapter_usage: dict[str, list[int]] | None = None


def shard_commit(*, shard_id: int, attempt: int, summary: PartSummary) -> bool:
    """Publish a part. Exactly one commit per shard can succeed; a False return means a newer attempt
    owns the shard (or its batch's validation failed and took it away) and the caller's part must be
    discarded. A shard of a batch still validating writes no ledger row: batches/intake/early_dispatch.py writes
    it when the file proves valid."""
    status = ShardStatus.STOPPED if summary.stopped else ShardStatus.SUCCEEDED
    with transaction.atomic():
        # The batch row first, as everything that ends a validation takes it: whether this commit or the
        # validation's end comes first, exactly one of them writes the ledger row (and none deadlocks).
        batch_status = (
            Batch.objects.select_for_update(of=("self",))
            .filter(shards__id=shard_id)
            .values_list("status", flat=True)
            .first()
        )
        if batch_status is None:
            return False
        won = Shard.objects.filter(id=shard_id, attempt=attempt, status=ShardStatus.RUNNING).update(
            status=status,
            part_name=summary.part_name,
            completed_lines=summary.completed,
            failed_lines=summary.failed,
            prompt_tokens=summary.tokens.input,
            completion_tokens=summary.tokens.output,
            cached_tokens=summary.tokens.cached,
            completion_choices=summary.tokens.choices,
            adapter_usage=summary.adapter_usage,
            finished_at=timezone.now(),
            lease_expires_at=None,
        )
        if won != 1:
            return False
        shard = Shard.objects.select_related("batch").only(*_USAGE_FIELDS).get(id=shard_id)
        if batch_status != BatchStatus.VALIDATING:
            for usage in shard_usage_from_row(shard):
                usage_record_shard(usage=usage)
        Batch.objects.filter(id=shard.batch_id).update(
            completed_lines=F("completed_lines") + summary.completed,
            failed_lines=F("failed_lines") + summary.failed,
            prompt_tokens=F("prompt_tokens") + summary.tokens.input,
            completion_tokens=F("completion_tokens") + summary.tokens.output,
            cached_tokens=F("cached_tokens") + summary.tokens.cached,
        )
        event_record(
            batch_id=shard.batch_id,
            shard_index=shard.index,
            kind=f"shard_{status}",
            message=f"attempt {attempt}: {summary.completed} ok, {summary.failed} errors",
        )
    return True


# What the ledger row and the commit read of the shard and its batch (not the batch's other columns).
_USAGE_FIELDS = (
    *("id", "batch_id", "index", "work_units", "request_count", "started_at", "finished_at", "triton_server"),
    *("completed_lines", "failed_lines", "prompt_tokens", "completion_tokens", "cached_tokens", "completion_choices"),
    "adapter_usage",
    *("batch__tenant_id", "batch__endpoint", "batch__model", "batch__model_snapshot"),
)


# A released shard waits this long (doubling per attempt, capped) before it is runnable again: the
# wait lives in the shard row (not_before), not in a Celery countdown held by a worker. The cap is low
# because infrastructure failures spend no attempts and a recovered Triton should get work back within
# ~5 s; the cost of a low cap during a long outage is one cheap failed claim per shard every 4 s.
RELEASE_BACKOFF_SECONDS = 1.0
RELEASE_BACKOFF_MAX_SECONDS = 4.0


def shard_release(*, shard_id: int, attempt: int, error: str, content_failure: bool) -> str | None:
    """Give a running shard back without a part. Returns its new status, or None when the lease had
    already been lost (a newer attempt or the rescuer owns the shard; nothing changes).

    ``content_failure`` says whose fault it was. False (Triton unreachable or restarting, no capacity, a
    model that would not load, storage I/O): the shard goes back to pending and spends nothing, so an
    outage of any length costs no lines. True (its own data made processing fail): ``content_failures``
    grows, and at SHARD_MAX_ATTEMPTS the shard becomes a dead letter (``dead``, ``last_error`` kept).
    Either way a stopping batch's shard is closed as ``skipped`` (its lines become batch_cancelled /
    batch_expired), so a cancel during an outage still completes."""
    now = timezone.now()
    with transaction.atomic():
        # The row lock (shard only) makes the budget check and the update one step.
        shard = (
            Shard.objects.select_for_update(of=("self",))
            .select_related("batch")
            .only("id", "index", "batch_id", "content_failures", "batch__stop_reason")
            .filter(id=shard_id, attempt=attempt, status=ShardStatus.RUNNING)
            .first()
        )
        if shard is None:
            return None
        failures = shard.content_failures + (1 if content_failure else 0)
        if shard.batch.stop_reason:
            new_status = ShardStatus.SKIPPED
        elif failures >= settings.SHARD_MAX_ATTEMPTS:
            new_status = ShardStatus.DEAD
        else:
            new_status = ShardStatus.PENDING
        closed = new_status != ShardStatus.PENDING
        backoff = min(RELEASE_BACKOFF_MAX_SECONDS, RELEASE_BACKOFF_SECONDS * 2 ** max(0, attempt - 1))
        Shard.objects.filter(id=shard_id).update(
            status=new_status,
            content_failures=failures,
            last_error=error[:2000],
            lease_owner="",
            lease_expires_at=None,
            not_before=None if closed else now + timedelta(seconds=backoff),
            finished_at=now if closed else None,
        )
        cause = (
            f"content failure {failures} of {settings.SHARD_MAX_ATTEMPTS}"
            if content_failure
            else "infrastructure, no attempt spent"
        )
        event_record(
            batch_id=shard.batch_id,
            shard_index=shard.index,
            kind=f"shard_released_{new_status}",
            message=f"attempt {attempt} ({cause}): {error[:500]}",
        )
    return new_status


def shards_rescue() -> list[int]:
    """Put shards whose worker died (lease expired) back to pending, or close them when their batch is
    stopping. A lost worker is an infrastructure fault: it spends none of the shard's content budget.
    Also closes pending shards of stopping batches (released by a worker just as the batch was cancelled),
    which nothing would claim again. Returns the shard ids made runnable again; the dispatcher's next
    top-up gives them slots."""
    now = timezone.now()
    runnable: list[int] = []
    expired = Shard.objects.filter(status=ShardStatus.RUNNING, lease_expires_at__lt=now)
    for shard in expired.select_related("batch").only(
        "id", "attempt", "batch_id", "index", "lease_expiries", "batch__stop_reason", "batch__model"
    ):
        if job_time_up():
            break  # the next run rescues the rest (core/workers/deadlines.py)
        expiries = shard.lease_expiries + 1
        # A stopping batch runs nothing new: the dead worker's lines are accounted as cancelled/expired.
        # A shard whose every run loses its worker is presumed to kill it (see Shard.lease_expiries).
        if shard.batch.stop_reason:
            new_status, error = ShardStatus.SKIPPED, "lease expired: worker lost"
        elif expiries >= settings.SHARD_MAX_LEASE_EXPIRIES:
            new_status = ShardStatus.DEAD
            error = f"lease expired {expiries} times: every worker that ran this shard was lost"
        else:
            new_status, error = ShardStatus.PENDING, "lease expired: worker lost"
        closed = new_status != ShardStatus.PENDING
        with transaction.atomic():
            won = Shard.objects.filter(id=shard.id, attempt=shard.attempt, status=ShardStatus.RUNNING).update(
                status=new_status,
                lease_expiries=expiries,
                lease_owner="",
                last_error=error,
                lease_expires_at=None,
                not_before=None,
                finished_at=now if closed else None,
            )
            if won == 1:
                event_record(
                    batch_id=shard.batch_id,
                    shard_index=shard.index,
                    kind=f"shard_rescued_{new_status}",
                    message=f"lease of attempt {shard.attempt} expired "
                    f"({expiries} of {settings.SHARD_MAX_LEASE_EXPIRIES} expiries, no content attempt spent)",
                )
                if closed:
                    dispatch.batch_finalize_enqueue(shard.batch_id)
                else:
                    runnable.append(shard.id)
                    dispatch.slots_topup_enqueue(shard.batch.model)
    stranded = Shard.objects.filter(status=ShardStatus.PENDING, batch__stop_reason__isnull=False)
    for shard_id, batch_id in list(stranded.values_list("id", "batch_id")):
        if shard_skip_if_stopping(shard_id=shard_id):
            dispatch.batch_finalize_enqueue(batch_id)
    return runnable


def shard_requeue(*, shard_id: int, actor: str) -> Shard:
    """Give a dead shard a fresh content budget and make it runnable again (an operator fixed the model,
    or wants one more try). Only while its batch is open (in_progress, no cancel/expiry): a batch
    finalizes once none of its shards is pending or running, and from then on a dead shard's lines are
    ``internal_error`` lines of its error file, to be re-run as a new batch.

    The batch row is locked first, and the finalizer checks for open shards under the same lock, so a
    requeue and a finalization never both win. ``attempt`` is not reset: it is the fencing token and only
    grows; the budgets (``content_failures``, ``lease_expiries``) are what start again."""
    with transaction.atomic():
        batch_id = Shard.objects.filter(id=shard_id).values_list("batch_id", flat=True).first()
        if batch_id is None:
            raise NotFound(f"No shard with id {shard_id}.", param="shard_id")
        batch = Batch.objects.select_for_update().only("id", "status", "stop_reason", "model").get(id=batch_id)
        if batch.status != BatchStatus.IN_PROGRESS or batch.stop_reason:
            state = f"{batch.status} ({batch.stop_reason})" if batch.stop_reason else batch.status
            raise Conflict(
                f"Batch {batch.id} is {state}: its dead shards can no longer be requeued; "
                "re-run its failed lines as a new batch instead.",
                param="shard_id",
            )
        shard = Shard.objects.only("id", "index", "status", "last_error").get(id=shard_id)
        won = Shard.objects.filter(id=shard_id, status=ShardStatus.DEAD).update(
            status=ShardStatus.PENDING,
            content_failures=0,
            lease_expiries=0,
            not_before=None,
            finished_at=None,
            lease_owner="",
            lease_expires_at=None,
        )
        if won != 1:
            raise Conflict(f"Shard {batch.id}#{shard.index} is {shard.status}, not dead.", param="shard_id")
        event_record(
            batch_id=batch.id,
            shard_index=shard.index,
            kind="shard_requeued",
            message=f"by {actor}; last error: {shard.last_error[:300]}",
        )
        dispatch.slots_topup_enqueue(batch.model)
    return Shard.objects.get(id=shard_id)
