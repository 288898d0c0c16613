from __future__ import annotations

from django.db.models import QuerySet

from controlplane.core.errors import NotFound
from controlplane.files.models import File
from controlplane.tenants.models import Tenant


def file_get(*, tenant: Tenant, file_id: str) -> File:
    """Another tenant's file is indistinguishable from a missing one."""
    file = File.objects.filter(tenant=tenant, id=file_id).first()
    if file is None:
        raise NotFound(f"No such File object: {file_id}", param="file_id")
    return file


def file_list(*, tenant: Tenant, purpose: str | None = None) -> QuerySet[File]:
    qs = File.objects.filter(tenant=tenant)
    if purpose:
        qs = qs.filter(purpose=purpose)
    return qs
