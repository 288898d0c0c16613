"""Re-run a finished batch's failed lines as a new batch (tenants through the API, operators through the
admin action). The new batch is an ordinary one: its own input file (the failed lines, copied byte for
byte from the original input, in their original order), admission and quotas as at create, and
``rerun_of`` naming its source."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable
from typing import IO, Any

from django.conf import settings
from django.db import transaction

from controlplane.batches.lines import iter_lines, load_json_line
from controlplane.batches.models import Batch, BatchStatus
from controlplane.batches.services import batch_create, event_record
from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.files.models import File
from controlplane.files.services import file_create, file_delete
from controlplane.files.storage import blob_open
from controlplane.kinds.base import LineIssue
from controlplane.tenants.models import PRIORITY_RANK, Priority

RERUNNABLE = (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
# The new input is assembled on local disk past this size, so a million failed lines need no RAM.
_SPOOL_BYTES = 8 * 1024 * 1024


def _error_code(record: Any) -> str | None:
    """The code of one error-file line: ``error.code`` when the request never ran, else the code of the
    error body the model answered with."""
    if not isinstance(record, dict):
        return None
    if isinstance(record.get("error"), dict):
        return record["error"].get("code")
    response = record.get("response")
    if isinstance(response, dict) and isinstance(response.get("body"), dict):
        error = response["body"].get("error")
        return error.get("code") if isinstance(error, dict) else None
    return None


def failed_custom_ids(batch: Batch, *, codes: Iterable[str] | None = None) -> set[str]:
    """custom_ids of the batch's error file, optionally only those with one of ``codes``."""
    if not batch.error_file_id:
        return set()
    wanted = set(codes) if codes else None
    error_file = File.objects.filter(id=batch.error_file_id).first()
    if error_file is None:
        raise Conflict(
            f"The error file {batch.error_file_id} of batch {batch.id} was deleted (or expired); the failed "
            "lines can no longer be found.",
            param="batch_id",
        )
    found: set[str] = set()
    with blob_open(error_file.storage_name) as stream:
        for raw in iter_lines(stream, max_line_bytes=settings.BATCH_MAX_LINE_BYTES):
            if raw.data is None or raw.is_blank:
                continue
            record = json.loads(raw.data)
            if wanted is None or _error_code(record) in wanted:
                found.add(record["custom_id"])
    return found


def _copy_lines(source: IO[bytes], custom_ids: set[str], sink: IO[bytes]) -> int:
    copied = 0
    for raw in iter_lines(source, max_line_bytes=settings.BATCH_MAX_LINE_BYTES):
        if raw.data is None or raw.is_blank:
            continue
        try:
            line = load_json_line(raw.data)
        except LineIssue:
            continue  # cannot be: the batch ran, so validation accepted every line
        if isinstance(line, dict) and line.get("custom_id") in custom_ids:
            sink.write(raw.data if raw.data.endswith(b"\n") else raw.data + b"\n")
            copied += 1
    return copied


def _priority_allowed(batch: Batch) -> str:
    """The source's class, lowered to the tenant's highest allowed one (an operator may have raised the
    source past it in the admin; the re-run is the tenant's request)."""
    highest = Priority(batch.tenant.max_priority)
    asked = Priority(batch.priority)
    return highest.value if PRIORITY_RANK[asked] < PRIORITY_RANK[highest] else asked.value


def _parse_codes(codes: Any) -> list[str] | None:
    if codes is None:
        return None
    if not isinstance(codes, list) or not codes or not all(isinstance(c, str) and c for c in codes):
        raise ValidationFailed("error_codes must be a non-empty list of error code strings.", param="error_codes")
    return codes


def batch_rerun_failed(*, batch: Batch, actor: str, error_codes: Any = None, completion_window: Any = None) -> Batch:
    """Create a batch of ``batch``'s failed lines (all of them, or those with one of ``error_codes``).

    Refused (409) while the batch is still open, when nothing failed, or when its input file was deleted.
    The new batch keeps the source's endpoint, metadata, priority and output expiry; its completion
    window is the source's unless given."""
    codes = _parse_codes(error_codes)
    if batch.status not in RERUNNABLE:
        raise Conflict(
            f"Batch {batch.id} is {batch.status}; only a completed, expired or cancelled batch's failed "
            "lines can be re-run.",
            param="batch_id",
        )
    custom_ids = failed_custom_ids(batch, codes=codes)
    if not custom_ids:
        which = f" with codes {codes}" if codes else ""
        raise Conflict(f"Batch {batch.id} has no failed lines{which} to re-run.", param="batch_id")
    source = File.objects.filter(id=batch.input_file_id, tenant_id=batch.tenant_id).first()
    if source is None:
        raise Conflict(
            f"The input file {batch.input_file_id} of batch {batch.id} was deleted; its failed lines cannot be re-run.",
            param="batch_id",
        )
    with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
        with blob_open(source.storage_name) as stream:
            _copy_lines(stream, custom_ids, spool)
        size = spool.tell()
        spool.seek(0)
        new_input = file_create(
            tenant=batch.tenant, content=spool, filename=f"{batch.id}_rerun.jsonl", purpose="batch", size=size
        )
    try:
        with transaction.atomic():
            rerun = batch_create(
                tenant=batch.tenant,
                input_file_id=new_input.id,
                endpoint=batch.endpoint,
                completion_window=completion_window or batch.completion_window,
                metadata=batch.metadata,
                priority=_priority_allowed(batch),
            )
            Batch.objects.filter(id=rerun.id).update(rerun_of=batch.id, output_expires_after=batch.output_expires_after)
            event_record(
                batch_id=rerun.id,
                kind="rerun_created",
                message=f"by {actor}: {len(custom_ids)} failed lines of {batch.id}",
            )
            event_record(batch_id=batch.id, kind="rerun", message=f"by {actor}: failed lines re-run as {rerun.id}")
    except Exception:
        file_delete(file=new_input)  # a refused create (a quota's 429) leaves no stray input behind
        raise
    return Batch.objects.get(id=rerun.id)
