"""A validation attempt's reading of a batch's input file, and failing a batch that is still validating.

``batch_input_check`` reads the file once and fails the batch on line errors; services.batch_validate starts a
batch whose input is valid (the start also skips an expired batch's shards, the run stage's write, which this
stage may not import). The rescuer (validation_rescue.py) and a rerun's input (results/rerun_input.py) fail a
batch here too."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.batches.intake.early_dispatch import EarlyShards, shards_discard
from controlplane.batches.intake.validation import BatchColumns, ValidationResult, validate_input
from controlplane.batches.intake.validation_deadline import DeadlineStream, attempt_stop_at
from controlplane.batches.models import Batch
from controlplane.batches.selectors import batch_input_name
from controlplane.batches.transitions import batch_fail
from controlplane.core.observability import tracing
from controlplane.files.selectors import file_storage_name
from controlplane.files.storage import blob_delete, blob_open, blob_save
from controlplane.kinds.registry import kind_for


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


@dataclass(frozen=True)
class CheckedInput:
    """A valid input file's reading: its lines, shards and model (``result``), the shards already added while it
    was read (``early``) and the columns blobs written beside them (``columns``)."""

    result: ValidationResult
    early: EarlyShards
    columns: BatchColumns


def batch_input_check(batch: Batch, attempt: int) -> CheckedInput | None:
    """Read the input once under the attempt's deadline. None when the batch failed here (its file deleted, or
    line errors); otherwise what services.batch_validate starts the batch with."""
    # file_delete refuses a live batch's input; this catches a delete that raced the batch's create.
    if file_storage_name(tenant_id=batch.tenant_id, file_id=batch.input_file_id) is None:
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
        return None
    early = EarlyShards(batch_id=batch.id, attempt=attempt)
    columns = BatchColumns(
        kind=kind_for(batch.endpoint), batch_id=batch.id, attempt=attempt, save=blob_save, delete=blob_delete
    )
    stop_at = attempt_stop_at(batch_id=batch.id, created_at=batch.created_at)
    with blob_open(batch_input_name(batch)) as stream:
        result = validate_input(
            DeadlineStream(stream, stop_at=stop_at),  # type: ignore[arg-type]  # readline is all it reads
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
        return None
    return CheckedInput(result=result, early=early, columns=columns)


def batch_validation_fail(batch: Batch, errors: list[dict[str, Any]], *, attempt: int | None = None) -> None:
    """Fail a validating batch (only as its current validation ``attempt``, when given); the shards that
    ran while it validated go with it, those that finished charged (batches/intake/early_dispatch.py)."""
    with transaction.atomic():
        if batch_fail(batch_id=batch.id, errors=errors, attempt=attempt, now=timezone.now()):
            shards_discard(batch_id=batch.id, charge=True)
        else:
            return
    # Each line-numbered error becomes an event of the validation span (when it is traced).
    line_errors = tracing.current_line_errors()
    for error in errors:
        line_errors.add(line=error.get("line") or 0, code=str(error.get("code")))
    line_errors.close()
