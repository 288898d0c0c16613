"""Shard claims, leases and commits. Every write is a conditional UPDATE; ``attempt`` is the fencing
token, so a worker that lost its lease can never overwrite the work of the one that took over."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.services import event_record
from controlplane.core import dispatch

logger = logging.getLogger(__name__)

RUNNABLE_BATCH_STATUSES = (BatchStatus.IN_PROGRESS,)


def _lease_until() -> datetime:
    return timezone.now() + timedelta(seconds=settings.SHARD_LEASE_SECONDS)


def shard_claim(*, shard_id: int, owner: str) -> Shard | None:
    """Take a pending shard of a running batch. None means someone else holds it, it is finished,
    or its batch is stopping — in every case there is nothing for this caller to do."""
    with transaction.atomic():
        won = Shard.objects.filter(
            id=shard_id,
            status=ShardStatus.PENDING,
            batch__status__in=RUNNABLE_BATCH_STATUSES,
            batch__stop_reason__isnull=True,
        ).update(
            status=ShardStatus.RUNNING,
            attempt=F("attempt") + 1,
            lease_owner=owner,
            lease_expires_at=_lease_until(),
            started_at=timezone.now(),
        )
        if won != 1:
            return None  # lost the race, or nothing to do
        shard = Shard.objects.select_related("batch").get(id=shard_id)
        event_record(
            batch_id=shard.batch_id,
            shard_index=shard.index,
            kind="shard_claimed",
            message=f"attempt {shard.attempt} by {owner}",
        )
    return shard


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
    prompt_tokens: int
    stopped: bool  # True when cancel/expiry interrupted the shard: the part holds only some lines


def shard_commit(*, shard_id: int, attempt: int, summary: PartSummary) -> bool:
    """Publish a part. Exactly one commit per shard can succeed; a False return means a newer attempt
    owns the shard and the caller's part must be discarded."""
    status = ShardStatus.STOPPED if summary.stopped else ShardStatus.SUCCEEDED
    with transaction.atomic():
        won = Shard.objects.filter(id=shard_id, attempt=attempt, status=ShardStatus.RUNNING).update(
            status=status,
            part_name=summary.part_name,
            completed_lines=summary.completed,
            failed_lines=summary.failed,
            prompt_tokens=summary.prompt_tokens,
            finished_at=timezone.now(),
            lease_expires_at=None,
        )
        if won != 1:
            return False
        shard = Shard.objects.only("batch_id", "index").get(id=shard_id)
        Batch.objects.filter(id=shard.batch_id).update(
            completed_lines=F("completed_lines") + summary.completed,
            failed_lines=F("failed_lines") + summary.failed,
            prompt_tokens=F("prompt_tokens") + summary.prompt_tokens,
        )
        event_record(
            batch_id=shard.batch_id,
            shard_index=shard.index,
            kind=f"shard_{status}",
            message=f"attempt {attempt}: {summary.completed} ok, {summary.failed} errors",
        )
    return True


# A released shard waits this long (doubling per attempt, capped) before it is runnable again: the
# wait lives in the shard row (not_before), not in a Celery countdown held by a worker.
RELEASE_BACKOFF_SECONDS = 1.0
RELEASE_BACKOFF_MAX_SECONDS = 30.0


def shard_release(*, shard_id: int, attempt: int, error: str) -> str | None:
    """Give a running shard back after a transient failure. Returns the new status (pending, or failed
    once attempts are exhausted), or None when the lease had already been lost."""
    exhausted = Shard.objects.filter(id=shard_id, attempt__gte=settings.SHARD_MAX_ATTEMPTS).exists()
    new_status = ShardStatus.FAILED if exhausted else ShardStatus.PENDING
    now = timezone.now()
    backoff = min(RELEASE_BACKOFF_MAX_SECONDS, RELEASE_BACKOFF_SECONDS * 2 ** max(0, attempt - 1))
    with transaction.atomic():
        won = Shard.objects.filter(id=shard_id, attempt=attempt, status=ShardStatus.RUNNING).update(
            status=new_status,
            last_error=error[:2000],
            lease_owner="",
            lease_expires_at=None,
            not_before=None if exhausted else now + timedelta(seconds=backoff),
            finished_at=now if exhausted else None,
        )
        if won != 1:
            return None
        shard = Shard.objects.only("batch_id", "index").get(id=shard_id)
        event_record(
            batch_id=shard.batch_id,
            shard_index=shard.index,
            kind=f"shard_released_{new_status}",
            message=f"attempt {attempt}: {error[:500]}",
        )
    return new_status


def shards_rescue() -> list[int]:
    """Put shards whose worker died (lease expired) back to pending, or close them when their batch is
    stopping or their attempts are spent. Returns the shard ids made runnable again; the dispatcher's
    next top-up gives them slots."""
    now = timezone.now()
    runnable: list[int] = []
    expired = Shard.objects.filter(status=ShardStatus.RUNNING, lease_expires_at__lt=now)
    for shard in expired.select_related("batch").only(
        "id", "attempt", "batch_id", "index", "batch__stop_reason", "batch__model"
    ):
        # A stopping batch runs nothing new: the dead worker's lines are accounted as cancelled/expired.
        if shard.batch.stop_reason:
            new_status = ShardStatus.SKIPPED
        elif shard.attempt >= settings.SHARD_MAX_ATTEMPTS:
            new_status = ShardStatus.FAILED
        else:
            new_status = ShardStatus.PENDING
        closed = new_status != ShardStatus.PENDING
        with transaction.atomic():
            won = Shard.objects.filter(id=shard.id, attempt=shard.attempt, status=ShardStatus.RUNNING).update(
                status=new_status,
                lease_owner="",
                last_error="lease expired: worker lost",
                lease_expires_at=None,
                not_before=None,
                finished_at=now if closed else None,
            )
            if won == 1:
                event_record(
                    batch_id=shard.batch_id,
                    shard_index=shard.index,
                    kind=f"shard_rescued_{new_status}",
                    message=f"lease of attempt {shard.attempt} expired",
                )
                if closed:
                    dispatch.batch_finalize_enqueue(shard.batch_id)
                else:
                    runnable.append(shard.id)
                    dispatch.slots_topup_enqueue(shard.batch.model)
    return runnable
