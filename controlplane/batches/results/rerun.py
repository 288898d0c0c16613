"""Re-run a finished batch's failed lines as a new batch (tenants through the API, operators through the
admin action). The new batch is an ordinary one: its own input file (the failed lines, copied byte for
byte from the original input, in their original order), admission and quotas as at create, and
``rerun_of`` naming its source.

The request only decides. It checks that the source can be re-run and admits the new batch as batch create
does (spend cap, concurrent batches, enqueued lines: the source's failed-line count is the most the new
input can hold), then creates it in ``validating`` under a file id reserved for its input, and answers.
Reading the error file and copying the failed lines costs time in proportion to the source's size (a
million failed lines is a gigabyte read), so that is the new batch's validation task's work
(batches/results/rerun_input.py): durable through the outbox like any validation, retried by the rescuer, bounded
by its deadline, and never a web thread's."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from controlplane.batches.intake.admission import batch_admit_lines
from controlplane.batches.intake.windows import parse_completion_window
from controlplane.batches.models import Batch, BatchStatus
from controlplane.batches.transitions import event_record
from controlplane.core.http.errors import Conflict, ValidationFailed
from controlplane.core.messaging import dispatch
from controlplane.core.observability import tracing
from controlplane.files.selectors import file_storage_name
from controlplane.files.services import file_reserve
from controlplane.tenants.models import PRIORITY_RANK, Priority, Tenant
from controlplane.usage.services import batch_origin_record

RERUNNABLE = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)


def _priority_allowed(batch: Batch, tenant: Tenant) -> str:
    """The source's class, lowered to the tenant's highest allowed one (an operator may have raised the
    source past it in the admin; the re-run is the tenant's request)."""
    highest = Priority(tenant.max_priority)
    asked = Priority(batch.priority)
    return highest.value if PRIORITY_RANK[asked] < PRIORITY_RANK[highest] else asked.value


def _parse_codes(codes: Any) -> list[str] | None:
    if codes is None:
        return None
    if not isinstance(codes, list) or not codes or not all(isinstance(c, str) and c for c in codes):
        raise ValidationFailed("error_codes must be a non-empty list of error code strings.", param="error_codes")
    return codes


def _rerunnable_check(batch: Batch) -> None:
    """What can be known without reading a file: the source ended, some of its lines failed, and both its
    files are still there. Whether any line failed with the codes asked for is known only once the error
    file is read: the new batch then fails at validation, saying so."""
    if batch.status not in RERUNNABLE:
        raise Conflict(
            f"Batch {batch.id} is {batch.status}; only a completed, expired or cancelled batch's failed "
            "lines can be re-run.",
            param="batch_id",
        )
    if not batch.error_file_id or not batch.failed_lines:
        raise Conflict(f"Batch {batch.id} has no failed lines to re-run.", param="batch_id")
    if file_storage_name(tenant_id=batch.tenant_id, file_id=batch.error_file_id) is None:
        raise Conflict(
            f"The error file {batch.error_file_id} of batch {batch.id} was deleted (or expired); the failed "
            "lines can no longer be found.",
            param="batch_id",
        )
    if file_storage_name(tenant_id=batch.tenant_id, file_id=batch.input_file_id) is None:
        raise Conflict(
            f"The input file {batch.input_file_id} of batch {batch.id} was deleted; its failed lines cannot be re-run.",
            param="batch_id",
        )


def batch_rerun_failed(
    *,
    batch: Batch,
    actor: str,
    error_codes: Any = None,
    completion_window: Any = None,
    api_key_id: int | None = None,
) -> Batch:
    """Create a batch of ``batch``'s failed lines (all of them, or those with one of ``error_codes``), in
    ``validating``; its validation task builds its input first (batches/results/rerun_input.py).

    Refused (409) while the batch is still open, when nothing failed, or when its input or error file was
    deleted; 429 over a quota, before anything is written. The new batch keeps the source's endpoint,
    metadata, priority and output expiry; its completion window is the source's unless given. ``api_key_id``
    (the key that asked; None from the admin) is the new batch's origin, written in its create transaction."""
    codes = _parse_codes(error_codes)
    _rerunnable_check(batch)
    window_text = completion_window or batch.completion_window
    window = parse_completion_window(window_text)
    with transaction.atomic():
        # Lock the tenant row, as batch create does, so two concurrent creates cannot both slip under a quota.
        tenant = Tenant.objects.select_for_update().get(id=batch.tenant_id)
        priority = batch_admit_lines(
            tenant=tenant, incoming_lines=batch.failed_lines, priority=_priority_allowed(batch, tenant)
        )
        # The file appears under this id and name once the validation task built it; its line count is not
        # known before (admission counted the source's failed lines).
        new_input = file_reserve(tenant_id=tenant.id)
        rerun = Batch.objects.create(
            tenant=tenant,
            endpoint=batch.endpoint,
            input_file_id=new_input.id,
            input_storage_name=new_input.storage_name,
            completion_window=window_text,
            metadata=batch.metadata,
            priority=priority,
            expires_at=timezone.now() + window,
            output_expires_after=batch.output_expires_after,
            rerun_of=batch.id,
            rerun_error_codes=codes,
            # The re-run is a trace of its own, under the request that asked for it (core/observability/tracing.py).
            trace_parent=tracing.current_traceparent(),
        )
        # "created" starts the validation deadline (validation_deadline.py), which the input build counts in.
        event_record(batch_id=rerun.id, kind="created", message=f"input {rerun.input_file_id}, priority {priority}")
        which = f" with codes {codes}" if codes else ""
        event_record(batch_id=rerun.id, kind="rerun_created", message=f"by {actor}: failed lines{which} of {batch.id}")
        event_record(batch_id=batch.id, kind="rerun", message=f"by {actor}: failed lines re-run as {rerun.id}")
        batch_origin_record(batch_id=rerun.id, api_key_id=api_key_id)
        dispatch.batch_validate_enqueue(rerun.id)
    return rerun
