from __future__ import annotations

from typing import IO, cast

from django.db import transaction

from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.files.in_use import file_in_use
from controlplane.files.lifecycle import file_expiry_set
from controlplane.files.linecount import LineCountingReader
from controlplane.files.models import File, new_file_id
from controlplane.files.quota import storage_quota_enforce
from controlplane.files.storage import blob_delete, blob_save
from controlplane.tenants.models import Tenant


def _storage_name(tenant: Tenant, file_id: str) -> str:
    return f"files/{tenant.id}/{file_id}"


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
    name = blob_save(_storage_name(tenant, file_id), cast(IO[bytes], counting))
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


def file_delete(*, file: File) -> None:
    reason = file_in_use(file)
    if reason is not None:
        raise Conflict(reason, param="file_id")
    with transaction.atomic():
        File.objects.filter(id=file.id).delete()
    blob_delete(file.storage_name)
