from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import IO, cast

from django.db import transaction

from controlplane.core.http.errors import Conflict, ValidationFailed
from controlplane.files.in_use import file_in_use
from controlplane.files.lifecycle import file_expiry_set
from controlplane.files.linecount import LineCountingReader
from controlplane.files.models import File, new_file_id
from controlplane.files.quota import storage_quota_enforce
from controlplane.files.storage import blob_delete, blob_save
from controlplane.tenants.models import Tenant


def _storage_name(tenant_id: int, file_id: str) -> str:
    return f"files/{tenant_id}/{file_id}"


@dataclass(frozen=True)
class ReservedFile:
    """A file's id handed out before its content exists, and the storage name ``file_create`` gives it."""

    id: str
    storage_name: str


def file_reserve(*, tenant_id: int) -> ReservedFile:
    """Name a file that a later ``file_create(file_id=...)`` stores (a re-run batch's input, built by its
    validation task): the batch keeps both from its create on, as it keeps an uploaded input's."""
    file_id = new_file_id()
    return ReservedFile(id=file_id, storage_name=_storage_name(tenant_id, file_id))


def file_create(
    *,
    tenant: Tenant,
    content: IO[bytes],
    filename: str,
    purpose: str,
    size: int,
    expires_after: int | None = None,
    file_id: str | None = None,
) -> File:
    """Store the blob first, then the row: a crash between the two leaves an orphan blob (the storage
    collector removes it), never a row pointing at nothing. Its non-blank lines are counted as storage
    reads it (``line_count``), so batch create can check the enqueued-lines quota without reading the file
    again. The row's transaction checks the tenant's storage quota (files/quota.py) and sets
    ``expires_at`` from ``expires_after`` seconds; over the quota, the stored blob is deleted. ``file_id`` is
    an id handed out before the content existed (a re-run batch names its input at once, batches/results/rerun.py);
    a second create of the same id fails at its blob (blob_save refuses a clash) or at the row."""
    if purpose not in File.Purpose.values:
        raise ValidationFailed(f"purpose must be 'batch' for uploads, got {purpose!r}.", param="purpose")
    file_id = file_id or new_file_id()
    counting = LineCountingReader(content, size=size)
    # cast: storage only calls read/seek/tell on it, which the wrapper provides.
    name = blob_save(_storage_name(tenant.id, file_id), cast(IO[bytes], counting))
    try:
        with transaction.atomic():
            storage_quota_enforce(tenant_id=tenant.id, incoming=size)
            file = File.objects.create(
                id=file_id,
                tenant=tenant,
                filename=filename[:255],
                purpose=purpose,
                bytes=size,
                storage_name=name,
                line_count=counting.line_count,
            )
            file_expiry_set(file=file, seconds=expires_after)
            return file
    except Exception:
        blob_delete(name)
        raise


def result_blob_name(*, tenant_id: int, stem: str) -> str:
    """A fresh storage name for a result file (the storage collector's ``results/`` prefix); its content is
    written there first, then ``file_result_create`` records the row."""
    return f"results/{tenant_id}/{stem}_{secrets.token_hex(4)}.jsonl"


# A result file's seek points (File.line_offsets) come about this far apart: a cursor past the first reads at most
# this much before its line, and a 20 GiB file (BATCH_MAX_OUTPUT_BYTES) has ~2,560 points, ~50 KB on its row.
LINE_INDEX_STEP_BYTES = 8 * 1024 * 1024


def file_result_create(
    *,
    tenant_id: int,
    filename: str,
    storage_name: str,
    size: int,
    expires_after: int | None,
    line_offsets: list[list[int]] | None = None,
) -> File:
    """The row of a result file (a batch's output or error file) whose blob is already stored under
    ``storage_name``. Call inside the transaction that publishes it: rolled back, no row names the blob and
    the caller deletes it (or the storage collector does). Never refused by the storage quota
    (files/quota.py): a finished batch always gets its files."""
    file = File.objects.create(
        tenant_id=tenant_id,
        filename=filename[:255],
        purpose=File.Purpose.BATCH_OUTPUT,
        bytes=size,
        storage_name=storage_name,
        line_offsets=line_offsets or None,
    )
    file_expiry_set(file=file, seconds=expires_after)
    return file


def file_delete(*, file: File) -> None:
    reason = file_in_use(file_id=file.id, tenant_id=file.tenant_id)
    if reason is not None:
        raise Conflict(reason, param="file_id")
    with transaction.atomic():
        File.objects.filter(id=file.id).delete()
    blob_delete(file.storage_name)
