from __future__ import annotations

from django.db.models import QuerySet

from controlplane.batches.models import ACTIVE_STATUSES, Batch, Shard, ShardStatus
from controlplane.core.errors import NotFound
from controlplane.files.models import File
from controlplane.tenants.models import Tenant


def batch_get(*, tenant: Tenant, batch_id: str) -> Batch:
    """Another tenant's batch is indistinguishable from a missing one."""
    batch = Batch.objects.filter(tenant=tenant, id=batch_id).first()
    if batch is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return batch


def batch_list(*, tenant: Tenant) -> QuerySet[Batch]:
    return Batch.objects.filter(tenant=tenant)


def batch_active_for_file(*, file: File) -> Batch | None:
    return (
        Batch.objects.filter(tenant_id=file.tenant_id, input_file_id=file.id, status__in=ACTIVE_STATUSES)
        .only("id", "status")
        .first()
    )


def batch_active_count(*, tenant: Tenant) -> int:
    return Batch.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).count()


def batch_has_open_shards(*, batch_id: str) -> bool:
    return Shard.objects.filter(
        batch_id=batch_id, status__in=(ShardStatus.PENDING, ShardStatus.RUNNING)
    ).exists()
