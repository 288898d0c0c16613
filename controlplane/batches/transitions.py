"""The batch state machine's one writer. Every change of a batch's ``status`` or ``stop_reason`` is a function
here that writes the new state with its timestamp, records its BatchEvent and, for a terminal state, emits
the tenant's webhook, all in the caller's transaction (as zulip's ``do_*`` actions are the only writers of
their rows). Callers (services.py, finalize.py) decide when a batch moves; this module is how. Each
transition is a conditional UPDATE from the states it may leave: False means the batch had already moved on
(or another worker moved it), and the caller must do nothing more. tests/batches/test_state_writers.py
fails when a status is written anywhere else.

    validating ──► in_progress ──► finalizing ──► completed
        │              │  (stop_reason cancel: cancelling; expire, spend_cap: stays in_progress)
        │              └──► cancelling ──► finalizing ──► cancelled / expired
        ├──► failed / cancelled (terminal at once: nothing ran that shows)
        └─ expire: stays validating with its stop reason; once valid it starts and finalizes at once, so that
           every line is answered (finished ones in the output, the rest ``batch_expired``)"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from controlplane.batches.models import Batch, BatchEvent, BatchStatus, StopReason
from controlplane.batches.usage_rows import held_usage_record
from controlplane.files.quota import storage_reservation_release
from controlplane.webhooks.services import batch_event_emit

logger = logging.getLogger(__name__)

# What a batch leaves ``finalizing`` as, by its stop reason (none: it ran to the end), and the timestamp that
# records it.
_TERMINAL_BY_STOP_REASON: dict[str | None, BatchStatus] = {
    StopReason.CANCEL: BatchStatus.CANCELLED,
    StopReason.EXPIRE: BatchStatus.EXPIRED,
    # OpenAI's status for a batch that could not finish, whose finished lines are in its output file and the rest in
    # its error file: SDK clients already read partial results off an expired batch. ``errors`` says why.
    StopReason.SPEND_CAP: BatchStatus.EXPIRED,
}
_STAMP = {
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.CANCELLED: "cancelled_at",
    BatchStatus.EXPIRED: "expired_at",
}
FINALIZABLE = (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)


def event_record(*, batch_id: str, kind: str, message: str = "", shard_index: int | None = None) -> None:
    """The audit trail of a batch and its shards (admin, retention prunes it with the batch)."""
    BatchEvent.objects.create(batch_id=batch_id, kind=kind, message=message, shard_index=shard_index)
    logger.info("batch=%s shard=%s %s %s", batch_id, shard_index, kind, message)


def _terminal_notify(*, batch_id: str, status: str, at: datetime) -> None:
    """The tenant's webhooks for a batch that just reached a terminal status (``batch.completed``, …), and the
    release of its reserved result bytes (files/quota.py). In the transaction that sets the status: the
    deliveries commit with it, and are only rows until then."""
    tenant_id = Batch.objects.values_list("tenant_id", flat=True).get(id=batch_id)
    # Its result files (saved in this transaction, if any) count against the storage quota from now on.
    storage_reservation_release(batch_id=batch_id)
    batch_event_emit(tenant_id=tenant_id, batch_id=batch_id, event_type=f"batch.{status}", created_at=at)


def batch_start(
    *,
    batch_id: str,
    attempt: int,
    now: datetime,
    total_lines: int,
    work_units: int,
    model: str,
    model_snapshot: dict[str, Any] | None,
    shards: int,
    added_early: int,
    body_errors: int = 0,
    quota_tokens: int = 0,
) -> bool:
    """validating → in_progress with what validation learned, only as validation ``attempt`` (a superseded
    attempt matches nothing). The ledger rows of the shards that committed while the file was checked are
    written with it (batches/intake/early_dispatch.py): the UPDATE has locked the batch row, which shard_commit takes
    first too, so exactly one of the two writes a shard's row."""
    moved = Batch.objects.filter(id=batch_id, status=BatchStatus.VALIDATING, validation_attempt=attempt).update(
        status=BatchStatus.IN_PROGRESS,
        in_progress_at=now,
        last_dispatched_at=now,
        total_lines=total_lines,
        work_units=work_units,
        quota_tokens=quota_tokens,
        model=model,
        model_snapshot=model_snapshot,
    )
    if moved != 1:
        return False
    held = held_usage_record(batch_id=batch_id)
    early = f"; {added_early} added while validating, {held} of them done" if added_early else ""
    refused = f"; {body_errors} refused (400 lines)" if body_errors else ""
    event_record(
        batch_id=batch_id,
        kind="in_progress",
        message=f"{total_lines} requests in {shards} shards, model {model}{refused}{early}",
    )
    return True


def batch_fail(*, batch_id: str, errors: list[dict[str, Any]], attempt: int | None, now: datetime) -> bool:
    """validating → failed with its error list (only as validation ``attempt``, when given)."""
    current = Batch.objects.filter(id=batch_id, status=BatchStatus.VALIDATING)
    if attempt is not None:
        current = current.filter(validation_attempt=attempt)
    moved = current.update(status=BatchStatus.FAILED, failed_at=now, errors={"object": "list", "data": errors})
    if moved == 1:
        event_record(batch_id=batch_id, kind="failed", message=f"{len(errors)} validation errors")
        _terminal_notify(batch_id=batch_id, status=BatchStatus.FAILED, at=now)
    return moved == 1


def batch_cancel_validating(*, batch_id: str, now: datetime) -> bool:
    """validating → cancelled at once: the tenant asked, and none of its lines shows yet, so there is nothing to
    finalize (an expiry is not this: the service ran out of time, and still answers every line)."""
    moved = Batch.objects.filter(id=batch_id, status=BatchStatus.VALIDATING).update(
        status=BatchStatus.CANCELLED, stop_reason=StopReason.CANCEL, cancelling_at=now, cancelled_at=now
    )
    if moved == 1:
        event_record(batch_id=batch_id, kind="cancelled", message="cancelled before validation finished")
        _terminal_notify(batch_id=batch_id, status=BatchStatus.CANCELLED, at=now)
    return moved == 1


def batch_stop_running(*, batch_id: str, reason: StopReason, now: datetime) -> bool:
    """A batch stops: a cancel makes an in_progress batch ``cancelling`` (also over an expiry already under
    way: the tenant asked); an expiry keeps an in_progress batch ``in_progress`` with its stop reason (OpenAI
    shows no ``expiring``), and a validating one ``validating``: its validation goes on, because the error
    file answers each line by its ``custom_id`` (services.batch_validate starts it and finalizes it at once).
    Its running shards stop between calls; it finalizes once they are closed."""
    if reason == StopReason.CANCEL:
        moved = Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS).update(
            status=BatchStatus.CANCELLING, stop_reason=reason, cancelling_at=now
        )
        kind, message = "cancelling", ""
    else:
        kind, message = "expiring", "while validating: its lines are answered once the file is checked"
        stoppable = Batch.objects.filter(id=batch_id, stop_reason__isnull=True)
        moved = stoppable.filter(status=BatchStatus.VALIDATING).update(stop_reason=reason)
        if moved == 0:  # (a batch that started in between is caught here)
            moved, message = stoppable.filter(status=BatchStatus.IN_PROGRESS).update(stop_reason=reason), ""
    if moved == 1:
        event_record(batch_id=batch_id, kind=kind, message=message)
    return moved == 1


def batch_stop_spend_capped(*, batch_id: str, code: str, message: str) -> bool:
    """An in_progress batch stops because its tenant reached its monthly spend cap: it stays ``in_progress`` (as an
    expiring one) with the reason in its ``errors`` (the Batch object's, and the message of each line that did not
    run); its running shards stop between calls and it finalizes once they are closed."""
    moved = Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS, stop_reason__isnull=True).update(
        stop_reason=StopReason.SPEND_CAP,
        errors={"object": "list", "data": [{"code": code, "message": message, "param": None, "line": None}]},
    )
    if moved == 1:
        event_record(batch_id=batch_id, kind="spend_capped", message=message)
    return moved == 1


def batch_finalizing(*, batch_id: str, now: datetime) -> bool:
    """in_progress / cancelling → finalizing: exactly one finalizer wins. The caller holds the batch row and
    has checked, under it, that no shard is open."""
    moved = Batch.objects.filter(id=batch_id, status__in=FINALIZABLE).update(
        status=BatchStatus.FINALIZING, finalizing_at=now
    )
    if moved == 1:
        event_record(batch_id=batch_id, kind="finalizing", message="every shard is closed")
    return moved == 1


def batch_finish(
    *,
    batch_id: str,
    stop_reason: str | None,
    completed: int,
    failed: int,
    output_file_id: str | None,
    error_file_id: str | None,
    now: datetime,
) -> BatchStatus | None:
    """finalizing → completed, or cancelled / expired by its stop reason, with the result files and the counts
    read from them. Returns the terminal status, or None when another finalizer finished first."""
    terminal = _TERMINAL_BY_STOP_REASON.get(stop_reason, BatchStatus.COMPLETED)
    moved = Batch.objects.filter(id=batch_id, status=BatchStatus.FINALIZING).update(
        status=terminal,
        completed_lines=completed,
        failed_lines=failed,
        output_file_id=output_file_id,
        error_file_id=error_file_id,
        **{_STAMP[terminal]: now},
    )
    if moved != 1:
        return None
    event_record(batch_id=batch_id, kind=terminal, message=f"{completed} ok, {failed} errors")
    _terminal_notify(batch_id=batch_id, status=terminal, at=now)
    return terminal
