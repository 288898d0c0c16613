"""Batch lifecycle: create, validate, cancel, expire. Only services change batch and shard rows,
and every change writes a BatchEvent."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q, Sum
from django.utils import timezone

from controlplane.batches.admission import batch_admit
from controlplane.batches.early_dispatch import (
    EarlyShards,
    ValidationSuperseded,
    shard_rows,
    shards_discard,
    validation_attempt_begin,
)
from controlplane.batches.models import (
    ACTIVE_STATUSES,
    Batch,
    BatchEvent,
    BatchStatus,
    Shard,
    ShardStatus,
    StopReason,
)
from controlplane.batches.usage_rows import held_usage_record
from controlplane.batches.validation import BatchColumns, validate_input
from controlplane.batches.windows import parse_completion_window
from controlplane.core import dispatch
from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.core.jsontext import bad_text
from controlplane.files.lifecycle import expires_after_parse
from controlplane.files.models import File
from controlplane.files.selectors import file_get
from controlplane.files.storage import blob_delete, blob_open, blob_save
from controlplane.kinds.registry import KINDS, endpoint_urls, kind_for, token_endpoint_urls
from controlplane.tenants.models import Tenant
from controlplane.webhooks.services import batch_event_emit

logger = logging.getLogger(__name__)


def event_record(*, batch_id: str, kind: str, message: str = "", shard_index: int | None = None) -> None:
    BatchEvent.objects.create(batch_id=batch_id, kind=kind, message=message, shard_index=shard_index)
    logger.info("batch=%s shard=%s %s %s", batch_id, shard_index, kind, message)


def batch_terminal_notify(*, batch_id: str, status: str, at: datetime) -> None:
    """The tenant's webhooks for a batch that just reached a terminal status (``batch.completed``, …). Call it
    in the transaction that sets the status: the deliveries commit with it, and are only rows until then."""
    tenant_id = Batch.objects.values_list("tenant_id", flat=True).get(id=batch_id)
    batch_event_emit(tenant_id=tenant_id, batch_id=batch_id, event_type=f"batch.{status}", created_at=at)


def _validate_metadata(metadata: Any) -> dict[str, str] | None:
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
) -> Batch:
    if not isinstance(endpoint, str) or endpoint not in KINDS:
        raise ValidationFailed(f"endpoint must be one of {endpoint_urls()}, got {endpoint!r}.", param="endpoint")
    window = parse_completion_window(completion_window)
    metadata = _validate_metadata(metadata)
    results_expire_after = expires_after_parse(output_expires_after, param="output_expires_after")
    if not isinstance(input_file_id, str):
        raise ValidationFailed("input_file_id must be a file id string.", param="input_file_id")
    input_file = file_get(tenant=tenant, file_id=input_file_id)
    if input_file.purpose != File.Purpose.BATCH:
        raise ValidationFailed(
            f"File {input_file.id} has purpose {input_file.purpose!r}; upload the input with purpose 'batch'.",
            param="input_file_id",
        )
    with transaction.atomic():
        # Lock the tenant row so two concurrent creates cannot both slip under a quota.
        locked = Tenant.objects.select_for_update().get(id=tenant.id)
        chosen_priority = batch_admit(tenant=locked, input_file=input_file, priority=priority)
        batch = Batch.objects.create(
            tenant=locked,
            endpoint=endpoint,
            input_file_id=input_file.id,
            completion_window=completion_window,
            metadata=metadata,
            priority=chosen_priority,
            expires_at=timezone.now() + window,
            output_expires_after=results_expire_after,
        )
        event_record(batch_id=batch.id, kind="created", message=f"input {input_file.id}, priority {chosen_priority}")
        dispatch.batch_validate_enqueue(batch.id)
    return batch


def batch_validate(*, batch_id: str) -> None:
    """Stream the input once; either every shard is created and the batch is in_progress, or the
    batch is failed with line-numbered errors. Nothing in between is ever visible.

    No input leaves the batch in ``validating``: a bad line is a line error, and any other failure (a
    bug, an unreadable blob) is logged and fails the batch with a ``validation_error`` entry. Only a
    lost database connection is raised again: then nothing can be written, and the batch is left in
    ``validating`` for the rescuer's deadline on that state to pick up."""
    batch = Batch.objects.select_related("tenant").get(id=batch_id)
    if batch.status != BatchStatus.VALIDATING:
        return  # a redelivered task after the batch moved on, or cancelled while queued
    attempt = validation_attempt_begin(batch_id=batch.id)
    if attempt is None:
        return
    try:
        _batch_validate_input(batch, attempt)
    except ValidationSuperseded:
        logger.info("batch=%s validation attempt %s superseded", batch.id, attempt)
    except (OperationalError, InterfaceError):
        raise
    except Exception as exc:
        logger.exception("batch=%s validation failed unexpectedly", batch.id)
        # The conditional update in batch_validation_fail leaves a batch that already moved on untouched.
        batch_validation_fail(
            batch,
            [validation_error_entry(batch.id, f"Validation stopped on an internal error ({type(exc).__name__})")],
            attempt=attempt,
        )


def validation_error_entry(batch_id: str, what_happened: str) -> dict[str, Any]:
    """The one error of a batch whose validation gave no verdict on its lines."""
    return {
        "code": "validation_error",
        "param": None,
        "line": None,
        "message": (
            f"{what_happened}; no result was kept or charged. "
            f"Create the batch again; if this repeats, report batch {batch_id}."
        ),
    }


def _batch_validate_input(batch: Batch, attempt: int) -> None:
    input_file = File.objects.filter(id=batch.input_file_id, tenant_id=batch.tenant_id).first()
    if input_file is None:
        batch_validation_fail(
            batch,
            [
                {
                    "code": "file_not_found",
                    "message": "The input file was deleted.",
                    "param": "input_file_id",
                    "line": None,
                }
            ],
            attempt=attempt,
        )
        return
    early = EarlyShards(batch_id=batch.id, attempt=attempt)
    columns = BatchColumns(
        kind=kind_for(batch.endpoint), batch_id=batch.id, attempt=attempt, save=blob_save, delete=blob_delete
    )
    with blob_open(input_file.storage_name) as stream:
        result = validate_input(
            stream,
            endpoint=batch.endpoint,
            max_line_bytes=settings.BATCH_MAX_LINE_BYTES,
            max_lines=settings.BATCH_MAX_LINES,
            shard_lines=settings.SHARD_MAX_LINES,
            shard_bytes=settings.SHARD_MAX_BYTES,
            shard_seconds=settings.SCHEDULER_SHARD_SECONDS,
            min_shard_lines=settings.SCHEDULER_SHARD_MIN_LINES,
            on_shard=early if settings.BATCH_EARLY_DISPATCH else None,
            columns_for=columns if settings.BATCH_SHARD_COLUMNS else None,
        )
    if not result.ok:
        errors = result.errors
        if result.error_count > len(errors):
            errors = [
                *errors,
                {
                    "code": "more_errors",
                    "param": None,
                    "line": None,
                    "message": f"{result.error_count - len(errors)} more errors not listed.",
                },
            ]
        batch_validation_fail(batch, errors, attempt=attempt)
        columns.discard()
        return
    over_quota = _enqueued_quota_error(batch, result.total, result.work_units)
    if over_quota is not None:
        batch_validation_fail(batch, [over_quota], attempt=attempt)
        columns.discard()
        return
    now = timezone.now()
    with transaction.atomic():
        moved = Batch.objects.filter(id=batch.id, status=BatchStatus.VALIDATING, validation_attempt=attempt).update(
            status=BatchStatus.IN_PROGRESS,
            in_progress_at=now,
            last_dispatched_at=now,
            total_lines=result.total,
            work_units=result.work_units,
            model=result.model,
            model_snapshot=result.model_snapshot,
        )
        if moved != 1:
            # Cancelled or expired while we validated (its shards went with it), or superseded.
            transaction.on_commit(columns.discard)
            return
        # The shards not yet added early, and the ledger rows of those that ran while the file was checked.
        Shard.objects.bulk_create(shard_rows(batch.id, result.shards[early.added :]))
        held = held_usage_record(batch_id=batch.id)
        event_record(
            batch_id=batch.id,
            kind="in_progress",
            message=(
                f"{result.total} requests in {len(result.shards)} shards, model {result.model}"
                + (f"; {result.body_errors} refused (400 lines)" if result.body_errors else "")
                + (f"; {early.added} added while validating, {held} of them done" if early.added else "")
            ),
        )
        # The batch is runnable: the dispatcher decides when its shards run (Postgres is the queue).
        dispatch.slots_topup_enqueue(result.model)
        if early.added:
            # Its last shard may have closed (committed, or dead) while it validated: nobody else would look.
            dispatch.batch_finalize_enqueue(batch.id)


def _enqueued_quota_error(batch: Batch, lines: int, work: int) -> dict[str, Any] | None:
    """The tenant's quotas on work waiting across its non-terminal batches, with this batch's exact
    counts (create checked lines from the upload's count; tokens are known only now)."""
    tenant = batch.tenant
    others = (
        Batch.objects.filter(tenant_id=batch.tenant_id, status__in=ACTIVE_STATUSES)
        .exclude(id=batch.id)
        .aggregate(lines=Sum("total_lines"), work=Sum("work_units", filter=Q(endpoint__in=token_endpoint_urls())))
    )
    queued_lines = (others["lines"] or 0) + lines
    if queued_lines > tenant.max_enqueued_lines:
        return {
            "code": "quota_exceeded",
            "param": None,
            "line": None,
            "message": (
                f"{lines} requests would bring the tenant's enqueued requests to {queued_lines}, "
                f"over the limit of {tenant.max_enqueued_lines}."
            ),
        }
    if kind_for(batch.endpoint).counts_tokens:
        queued_tokens = (others["work"] or 0) + work
        if queued_tokens > tenant.max_enqueued_tokens:
            # OpenAI's code for the same condition, so clients can handle it the same way.
            return {
                "code": "token_limit_exceeded",
                "param": None,
                "line": None,
                "message": (
                    f"Enqueued token limit reached: this batch's ~{work} tokens would bring the tenant's "
                    f"enqueued tokens to ~{queued_tokens}, over the limit of {tenant.max_enqueued_tokens}. "
                    "Wait for other batches to finish or split the file."
                ),
            }
    return None


def batch_validation_fail(batch: Batch, errors: list[dict[str, Any]], *, attempt: int | None = None) -> None:
    """Fail a validating batch (only as its current validation ``attempt``, when given); the shards that
    ran while it validated go with it (batches/early_dispatch.py)."""
    now = timezone.now()
    current = Batch.objects.filter(id=batch.id, status=BatchStatus.VALIDATING)
    if attempt is not None:
        current = current.filter(validation_attempt=attempt)
    with transaction.atomic():
        moved = current.update(status=BatchStatus.FAILED, failed_at=now, errors={"object": "list", "data": errors})
        if moved == 1:
            shards_discard(batch_id=batch.id)
            event_record(batch_id=batch.id, kind="failed", message=f"{len(errors)} validation errors")
            batch_terminal_notify(batch_id=batch.id, status=BatchStatus.FAILED, at=now)


def batch_cancel(*, batch: Batch) -> Batch:
    """Stop a batch, keeping every line already finished. Idempotent for a batch already stopping."""
    now = timezone.now()
    with transaction.atomic():
        if Batch.objects.filter(id=batch.id, status=BatchStatus.VALIDATING).update(
            status=BatchStatus.CANCELLED, stop_reason=StopReason.CANCEL, cancelling_at=now, cancelled_at=now
        ):
            shards_discard(batch_id=batch.id)
            event_record(batch_id=batch.id, kind="cancelled", message="cancelled before validation finished")
            batch_terminal_notify(batch_id=batch.id, status=BatchStatus.CANCELLED, at=now)
        elif Batch.objects.filter(id=batch.id, status=BatchStatus.IN_PROGRESS).update(
            status=BatchStatus.CANCELLING, stop_reason=StopReason.CANCEL, cancelling_at=now
        ):
            _stop_pending_shards(batch.id)
            event_record(batch_id=batch.id, kind="cancelling")
            dispatch.batch_finalize_enqueue(batch.id)
        else:
            current = Batch.objects.get(id=batch.id)
            if current.status not in (BatchStatus.CANCELLING, BatchStatus.CANCELLED):
                raise Conflict(
                    f"Batch {batch.id} is {current.status} and can no longer be cancelled.", param="batch_id"
                )
    return Batch.objects.get(id=batch.id)


def _stop_pending_shards(batch_id: str) -> None:
    Shard.objects.filter(batch_id=batch_id, status=ShardStatus.PENDING).update(
        status=ShardStatus.SKIPPED, finished_at=timezone.now(), lease_expires_at=None, not_before=None
    )


def batches_expire() -> list[str]:
    """Batches past expires_at stop: finished lines stay in the output, the rest become
    ``batch_expired`` lines in the error file."""
    now = timezone.now()
    expired: list[str] = []
    for batch_id in Batch.objects.filter(
        expires_at__lt=now, status__in=(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS), stop_reason__isnull=True
    ).values_list("id", flat=True):
        with transaction.atomic():
            if Batch.objects.filter(id=batch_id, status=BatchStatus.VALIDATING).update(
                status=BatchStatus.EXPIRED, stop_reason=StopReason.EXPIRE, expired_at=now
            ):
                shards_discard(batch_id=batch_id)
                event_record(batch_id=batch_id, kind="expired", message="expired before validation finished")
                batch_terminal_notify(batch_id=batch_id, status=BatchStatus.EXPIRED, at=now)
            elif Batch.objects.filter(id=batch_id, status=BatchStatus.IN_PROGRESS, stop_reason__isnull=True).update(
                stop_reason=StopReason.EXPIRE
            ):
                _stop_pending_shards(batch_id)
                event_record(batch_id=batch_id, kind="expiring")
                dispatch.batch_finalize_enqueue(batch_id)
            else:
                continue
        expired.append(batch_id)
    return expired
