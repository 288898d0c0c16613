"""Batch lifecycle: create, validate, cancel, expire, stop at the tenant's spend cap, and running a shard the
scheduler claimed. The status changes themselves are transitions.py's (batch) and shards.py's (shard), which write
each change's BatchEvent with it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from controlplane.batches.intake.admission import batch_admit, batch_admit_validated
from controlplane.batches.intake.early_dispatch import ValidationSuperseded, shard_rows, shards_discard
from controlplane.batches.intake.turns import WAIT, validation_turn_pass, validation_turn_take
from controlplane.batches.intake.validation_deadline import ValidationDeadlinePassed
from controlplane.batches.intake.verdict import (
    CheckedInput,
    batch_input_check,
    batch_validation_fail,
    validation_error_entry,
)
from controlplane.batches.intake.windows import parse_completion_window
from controlplane.batches.models import Batch, BatchStatus, Shard, StopReason
from controlplane.batches.results.finalize import SPEND_CAP_ERROR_CODE, batch_try_finalize
from controlplane.batches.run.execution import SHARD_CLOSED_OUTCOMES, shard_execute
from controlplane.batches.shards import shards_skip_pending
from controlplane.batches.transitions import (
    batch_cancel_validating,
    batch_start,
    batch_stop_running,
    batch_stop_spend_capped,
    event_record,
)
from controlplane.core.http.errors import Conflict, ValidationFailed
from controlplane.core.jsontext import bad_text
from controlplane.core.messaging import dispatch
from controlplane.core.observability import tracing
from controlplane.core.workers.deadlines import job_time_up
from controlplane.files.lifecycle import expires_after_parse
from controlplane.files.quota import storage_reserve
from controlplane.files.selectors import file_batch_input_get
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import Backend
from controlplane.kinds.registry import KINDS, endpoint_urls
from controlplane.tenants.models import Tenant
from controlplane.usage.services import batch_origin_record
from controlplane.usage.spendcap import spend_caps_refresh

logger = logging.getLogger(__name__)


def metadata_validate(metadata: Any) -> dict[str, str] | None:
    # OpenAI's limits: up to 16 pairs, keys up to 64 characters, values up to 512.
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or len(metadata) > 16:
        raise ValidationFailed("metadata must be an object with at most 16 pairs.", param="metadata")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise ValidationFailed(
                "metadata keys must be at most 64 characters and values strings of at most 512.",
                param="metadata",
            )
    # Postgres's jsonb refuses NUL and a lone surrogate cannot be encoded (the API's parser already
    # refuses both; this guards other callers).
    if bad_text(metadata, reject_nul=True) is not None:
        raise ValidationFailed(
            "metadata keys and values must be valid Unicode text without NUL characters.", param="metadata"
        )
    return metadata


def batch_create(
    *,
    tenant: Tenant,
    input_file_id: Any,
    endpoint: Any,
    completion_window: Any,
    metadata: Any = None,
    priority: Any = None,
    output_expires_after: Any = None,
    api_key_id: int | None = None,
) -> Batch:
    """A batch in ``validating``, its ``created`` event, its origin (the API key that asked, for the usage
    ledger's grouping by key) and its validation message, all in one transaction: a batch never exists
    without its origin row. The batch keeps what it needs of its input (its blob's name, its line count), so
    the pipeline never reads the file's row again."""
    if not isinstance(endpoint, str) or endpoint not in KINDS:
        raise ValidationFailed(f"endpoint must be one of {endpoint_urls()}, got {endpoint!r}.", param="endpoint")
    window = parse_completion_window(completion_window)
    metadata = metadata_validate(metadata)
    results_expire_after = expires_after_parse(output_expires_after, param="output_expires_after")
    if not isinstance(input_file_id, str):
        raise ValidationFailed("input_file_id must be a file id string.", param="input_file_id")
    input_file = file_batch_input_get(tenant=tenant, file_id=input_file_id)
    # The batch's trace starts here (under the request's span when the web is instrumented): core/observability/tracing.py.
    with tracing.span("batch.create", attributes={"tenant.id": tenant.id, "batch.endpoint": endpoint}) as span:
        with transaction.atomic():
            # Lock the tenant row so two concurrent creates cannot both slip under a quota.
            locked = Tenant.objects.select_for_update().get(id=tenant.id)
            chosen_priority = batch_admit(tenant=locked, input_file=input_file, priority=priority)
            batch = Batch.objects.create(
                tenant=locked,
                endpoint=endpoint,
                input_file_id=input_file.id,
                input_storage_name=input_file.storage_name,
                input_line_count=input_file.line_count,
                completion_window=completion_window,
                metadata=metadata,
                priority=chosen_priority,
                expires_at=timezone.now() + window,
                output_expires_after=results_expire_after,
                trace_parent=tracing.current_traceparent(),
            )
            event_record(
                batch_id=batch.id, kind="created", message=f"input {input_file.id}, priority {chosen_priority}"
            )
            batch_origin_record(batch_id=batch.id, api_key_id=api_key_id)
            dispatch.batch_validate_enqueue(batch.id)
        if span is not None:
            span.set_attribute("batch.id", batch.id)
    return batch


def batch_validate(*, batch_id: str, waiting: bool = False) -> None:
    """Stream the input once; either every shard is created and the batch is in_progress, or the
    batch is failed with line-numbered errors. Nothing in between is ever visible.

    No input leaves the batch in ``validating``: a bad line is a line error, and any other failure (a
    bug, an unreadable blob) is logged and fails the batch with a ``validation_error`` entry. Only a
    lost database connection is raised again: then nothing can be written, and the batch is left in
    ``validating`` for the rescuer's deadline on that state to pick up. A batch whose tenant already validates
    VALIDATION_MAX_PER_TENANT batches waits its turn (intake/turns.py)."""
    batch = Batch.objects.select_related("tenant").get(id=batch_id)
    if batch.status != BatchStatus.VALIDATING:
        return  # a redelivered task after the batch moved on, or cancelled while queued
    # At most VALIDATION_MAX_PER_TENANT of a tenant's batches validate at once; past it, the message goes round.
    attempt = validation_turn_take(batch_id=batch.id, waiting=waiting)
    if attempt is None or attempt == WAIT:
        return
    try:
        _batch_validate_attempt(batch, attempt)
    finally:
        # The tenant's turn is free (or this attempt stopped): its next waiting batch need not wait out its round.
        validation_turn_pass(tenant_id=batch.tenant_id)


def _batch_validate_attempt(batch: Batch, attempt: int) -> None:
    attributes = {"batch.id": batch.id, "validation.attempt": attempt}
    with tracing.batch_span("batch.validate", traceparent=batch.trace_parent, attributes=attributes) as span:
        try:
            checked = batch_input_check(batch, attempt)
            if checked is not None:
                _batch_start_validated(batch, attempt, checked)
        except ValidationSuperseded:
            logger.info("batch=%s validation attempt %s superseded", batch.id, attempt)
        except ValidationDeadlinePassed:
            # Left in validating: the rescuer's deadline, a moment later, retries it or fails it (validation_deadline.py).
            logger.warning("batch=%s validation attempt %s stopped at its deadline", batch.id, attempt)
        except (OperationalError, InterfaceError):
            raise
        except Exception as exc:
            logger.exception("batch=%s validation failed unexpectedly", batch.id)
            tracing.span_fail(span, f"validation stopped on an internal error: {exc!r}")
            # The conditional update in batch_validation_fail leaves a batch that already moved on untouched.
            batch_validation_fail(
                batch,
                [validation_error_entry(batch.id, f"Validation stopped on an internal error ({type(exc).__name__})")],
                attempt=attempt,
            )


def _batch_start_validated(batch: Batch, attempt: int, checked: CheckedInput) -> None:
    """Admit the valid input against the tenant's limits and start the batch with all its shards, in one
    transaction; a refusal fails it."""
    result, early, columns = checked.result, checked.early, checked.columns
    now = timezone.now()
    with transaction.atomic():
        # The batch row first (NO KEY UPDATE, as batch_start's own UPDATE takes), then the tenant's: the order of
        # a cancel or a finalizer (batch row, then the tenant's row at their commit's foreign-key checks). Tenant
        # first deadlocked with a cancel (2026-12-03).
        # Its stop reason cannot change from here to the commit (an expiry's UPDATE waits for this lock).
        stop_reason = (
            Batch.objects.select_for_update(no_key=True)
            .filter(id=batch.id)
            .values_list("stop_reason", flat=True)
            .first()
        )
        # The tenant row is locked from here to the commit: a concurrent validation of the same tenant counts
        # this batch's lines, tokens and reserved results once it is in progress (batches/intake/admission.py).
        refused, expected_output = batch_admit_validated(
            batch=batch,
            lines=result.total,
            work_units=result.work_units,
            quota_tokens=result.quota_tokens,
            model_snapshot=result.model_snapshot,
            output_bytes=result.output_bytes,
        )
        if refused is None:
            started = batch_start(
                batch_id=batch.id,
                attempt=attempt,
                now=now,
                total_lines=result.total,
                work_units=result.work_units,
                model=result.model,
                model_snapshot=result.model_snapshot,
                shards=len(result.shards),
                added_early=early.added,
                body_errors=result.body_errors,
                quota_tokens=result.quota_tokens,
            )
            if not started:
                # Cancelled while we validated (its shards went with it), or superseded.
                transaction.on_commit(columns.discard)
                return
            storage_reserve(tenant_id=batch.tenant_id, batch_id=batch.id, expected=expected_output)
            # The shards not yet added early.
            Shard.objects.bulk_create(shard_rows(batch.id, result.shards[early.added :]))
            # Expired while it validated (batches_expire): none of its shards runs any more, and it finalizes
            # now, answering each line that did not finish with batch_expired.
            expired = stop_reason == StopReason.EXPIRE
            if expired:
                shards_skip_pending(batch_id=batch.id)
            else:
                # The batch is runnable: the dispatcher decides when its shards run (Postgres is the queue).
                dispatch.slots_topup_enqueue(result.model)
            if early.added or expired:
                # Its last shard may have closed (committed, or dead) while it validated: nobody else would look.
                dispatch.batch_finalize_enqueue(batch.id)
    if refused is not None:
        batch_validation_fail(batch, [refused], attempt=attempt)
        columns.discard()


def batch_cancel(*, batch: Batch) -> Batch:
    """Stop a batch, keeping every line already finished. Idempotent for a batch already stopping."""
    now = timezone.now()
    with transaction.atomic():
        if batch_cancel_validating(batch_id=batch.id, now=now):
            shards_discard(batch_id=batch.id, charge=True)
        elif batch_stop_running(batch_id=batch.id, reason=StopReason.CANCEL, now=now):
            shards_skip_pending(batch_id=batch.id)
            dispatch.batch_finalize_enqueue(batch.id)
        else:
            current = Batch.objects.get(id=batch.id)
            if current.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
                raise Conflict(
                    f"Batch {batch.id} is {current.status} and can no longer be cancelled.", param="batch_id"
                )
    return Batch.objects.get(id=batch.id)


def batches_expire() -> list[str]:
    """Batches past expires_at stop: finished lines stay in the output, the rest become
    ``batch_expired`` lines in the error file. A batch still validating keeps validating (the error file
    needs its lines' ids) and finalizes as soon as its file is valid (batch_validate)."""
    now = timezone.now()
    expired: list[str] = []
    for batch_id in Batch.objects.filter(
        expires_at__lt=now, status__in=(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS), stop_reason__isnull=True
    ).values_list("id", flat=True):
        if job_time_up():
            break  # the next run expires the rest (core/workers/deadlines.py)
        with transaction.atomic():
            if not batch_stop_running(batch_id=batch_id, reason=StopReason.EXPIRE, now=now):
                continue
            shards_skip_pending(batch_id=batch_id)
            if Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS).exists():
                dispatch.batch_finalize_enqueue(batch_id)
        expired.append(batch_id)
    return expired


def batches_stop_spend_capped() -> list[str]:
    """Refresh the tenants' spend-cap marks (which stop the scheduler claiming their shards) and stop the running
    batches of the tenants at their cap: finished lines stay in the output, the rest become ``spend_cap_exceeded``
    lines in the error file, and the batch ends ``expired`` with the reason in its ``errors``. A batch still
    validating is stopped once it starts (its shards are not claimed meanwhile); a new month or a raised cap
    clears the mark, and new batches run again."""
    reached = spend_caps_refresh(now=timezone.now())
    stopped: list[str] = []
    for cap in reached:
        message = cap.message()
        for batch_id in Batch.objects.filter(
            tenant_id=cap.tenant_id, status=BatchStatus.IN_PROGRESS, stop_reason__isnull=True
        ).values_list("id", flat=True):
            if job_time_up():
                return stopped  # the next run stops the rest (core/workers/deadlines.py)
            with transaction.atomic():
                if not batch_stop_spend_capped(batch_id=batch_id, code=SPEND_CAP_ERROR_CODE, message=message):
                    continue
                shards_skip_pending(batch_id=batch_id)
                dispatch.batch_finalize_enqueue(batch_id)
            stopped.append(batch_id)
    return stopped


def shard_run(
    *, shard: Shard, model: CatalogueModel, backend: Backend, on_succeeded: Callable[[], None] | None = None
) -> str:
    """Run a shard the scheduler claimed (run/execution.py) and, when it closed the batch's last open shard,
    finalize the batch. ``on_succeeded`` is the scheduler's accounting of a committed shard, called before the
    finalize (which may take seconds for a large batch). Returns shard_execute's outcome: succeeded, stopped,
    stale, lease_lost, deferred, retry, dead or skipped."""
    outcome = shard_execute(shard=shard, model=model, backend=backend)
    if outcome == "succeeded" and on_succeeded is not None:
        on_succeeded()
    if outcome in SHARD_CLOSED_OUTCOMES:
        # Finalize runs here, inline in the slot that closed the batch's last shard: its output is assembled at
        # once by a worker already holding the batch's files, with no queue hop. The control queue's
        # batch_finalize (core/messaging/dispatch.py) covers what no slot closes: cancel, expiry, a finalizer that died.
        batch_try_finalize(batch_id=shard.batch_id)
    return outcome
