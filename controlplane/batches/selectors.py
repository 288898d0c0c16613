from __future__ import annotations

from django.db.models import Case, F, OuterRef, PositiveBigIntegerField, QuerySet, Subquery, Sum, Value, When
from django.db.models.functions import Coalesce

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


def file_input_of_active_batch(file: File) -> str | None:
    """files' in-use check (files/in_use.py): an active batch still reads its input file."""
    active = batch_active_for_file(file=file)
    if active is None:
        return None
    return (
        f"File {file.id} is the input of batch {active.id}, which is still {active.status}; "
        "cancel the batch or wait for it to finish before deleting the file."
    )


def batch_active_count(*, tenant: Tenant) -> int:
    return Batch.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).count()


def batch_enqueued_lines(*, tenant: Tenant) -> int:
    """Requests in the tenant's non-terminal batches: each batch's validated ``total_lines``, or, while it
    is still validating (``total_lines`` is 0 until then), the line count its input file recorded at
    upload (0 for a file stored before uploads counted lines)."""
    upload_lines = File.objects.filter(id=OuterRef("input_file_id")).values("line_count")[:1]
    lines = Case(
        When(total_lines__gt=0, then=F("total_lines")),
        default=Coalesce(Subquery(upload_lines), Value(0)),
        output_field=PositiveBigIntegerField(),
    )
    total = Batch.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).aggregate(n=Sum(lines))["n"]
    return int(total or 0)


def batch_has_open_shards(*, batch_id: str) -> bool:
    return Shard.objects.filter(batch_id=batch_id, status__in=(ShardStatus.PENDING, ShardStatus.RUNNING)).exists()
