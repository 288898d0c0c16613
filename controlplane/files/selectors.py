from __future__ import annotations

import bisect
from dataclasses import dataclass

from django.db.models import Q, QuerySet
from django.utils import timezone

from controlplane.core.http.errors import NotFound, ValidationFailed
from controlplane.files.models import File
from controlplane.tenants.models import Tenant


def _unexpired(qs: QuerySet[File]) -> QuerySet[File]:
    """Past ``expires_at`` a file is gone for the tenant, as on OpenAI, even before beat deletes it (or
    while a live batch still reads it: files/retention.files_expire deletes it when that batch ends)."""
    return qs.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=timezone.now()))


def file_get(*, tenant: Tenant, file_id: str) -> File:
    """Another tenant's file, and an expired one, are indistinguishable from a missing one."""
    file = _unexpired(File.objects.filter(tenant=tenant, id=file_id)).first()
    if file is None:
        raise NotFound(f"No such File object: {file_id}", param="file_id")
    return file


def file_list(*, tenant: Tenant, purpose: str | None = None) -> QuerySet[File]:
    qs = _unexpired(File.objects.filter(tenant=tenant))
    if purpose:
        qs = qs.filter(purpose=purpose)
    return qs


def file_batch_input_get(*, tenant: Tenant, file_id: str) -> File:
    """The tenant's file for a batch to read: it exists, has not expired, and was uploaded as a batch input."""
    file = file_get(tenant=tenant, file_id=file_id)
    if file.purpose != File.Purpose.BATCH:
        raise ValidationFailed(
            f"File {file.id} has purpose {file.purpose!r}; upload the input with purpose 'batch'.",
            param="input_file_id",
        )
    return file


@dataclass(frozen=True)
class LineSeek:
    """Where the ``line``-th line of a stored file is read from: ``start_byte`` after the file's seek point at or
    before it (File.line_offsets), then ``skip_lines`` lines more."""

    storage_name: str
    start_byte: int
    skip_lines: int


def file_line_seek(*, tenant_id: int, file_id: str, line: int) -> LineSeek | None:
    """How to reach line ``line`` (0-based) of the tenant's file, or None when its row is gone (as
    ``file_storage_name``)."""
    row = File.objects.filter(tenant_id=tenant_id, id=file_id).values_list("storage_name", "line_offsets").first()
    if row is None:
        return None
    storage_name, offsets = row
    lines_before, start_byte = 0, 0
    if offsets:
        # The last point at or before ``line``: points are in file order, both columns increasing.
        at = bisect.bisect_right([point[0] for point in offsets], line) - 1
        if at >= 0:
            lines_before, start_byte = offsets[at]
    return LineSeek(storage_name=storage_name, start_byte=start_byte, skip_lines=line - lines_before)


def file_storage_name(*, tenant_id: int, file_id: str) -> str | None:
    """The blob of the tenant's file, or None when its row is gone (deleted, or expired and collected). An
    expired file that beat has not deleted yet still answers: a batch that read it keeps reading it."""
    return File.objects.filter(tenant_id=tenant_id, id=file_id).values_list("storage_name", flat=True).first()
