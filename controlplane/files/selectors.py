from __future__ import annotations

from django.db.models import Q, QuerySet
from django.utils import timezone

from controlplane.core.errors import NotFound
from controlplane.files.models import File
from controlplane.tenants.models import Tenant


def _unexpired(qs: QuerySet[File]) -> QuerySet[File]:
    """Past ``expires_at`` a file is gone for the tenant, as on OpenAI, even before beat deletes it (or
    while a live batch still reads it: batches/retention.files_expire deletes it when that batch ends)."""
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
