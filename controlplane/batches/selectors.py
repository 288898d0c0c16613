from __future__ import annotations

from django.db.models import Case, F, PositiveBigIntegerField, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce

from controlplane.batches.models import ACTIVE_STATUSES, Batch, Shard, ShardStatus
from controlplane.core.http.errors import NotFound
from controlplane.files.selectors import file_storage_name
from controlplane.tenants.models import Tenant


def batch_get(*, tenant: Tenant, batch_id: str) -> Batch:
    """Another tenant's batch is indistinguishable from a missing one."""
    batch = Batch.objects.filter(tenant=tenant, id=batch_id).first()
    if batch is None:
        raise NotFound(f"No such Batch object: {batch_id}", param="batch_id")
    return batch


def batch_list(*, tenant: Tenant) -> QuerySet[Batch]:
    return Batch.objects.filter(tenant=tenant)


def batch_active_count(*, tenant: Tenant) -> int:
    return Batch.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).count()


def batch_enqueued_lines(*, tenant: Tenant) -> int:
    """Requests in the tenant's non-terminal batches: each batch's validated ``total_lines``, or, while it
    is still validating (``total_lines`` is 0 until then), the line count its input file recorded at
    upload, kept on the batch at create (0 for a file stored before uploads counted lines, and for a re-run,
    whose input does not exist yet)."""
    lines = Case(
        When(total_lines__gt=0, then=F("total_lines")),
        default=Coalesce(F("input_line_count"), Value(0)),
        output_field=PositiveBigIntegerField(),
    )
    total = Batch.objects.filter(tenant=tenant, status__in=ACTIVE_STATUSES).aggregate(n=Sum(lines))["n"]
    return int(total or 0)


def batch_has_open_shards(*, batch_id: str) -> bool:
    return Shard.objects.filter(batch_id=batch_id, status__in=(ShardStatus.PENDING, ShardStatus.RUNNING)).exists()


def batch_input_name(batch: Batch) -> str:
    """The blob of the batch's input, as kept on the batch at create: validation, execution and finalization
    read it from here, never from the file's row (the tenant may delete the file once the batch ends). A batch
    written by the last release has none (it predates the field, a rolling upgrade): its file names it."""
    if batch.input_storage_name:
        return batch.input_storage_name
    name = file_storage_name(tenant_id=batch.tenant_id, file_id=batch.input_file_id)
    if name is None:
        raise FileNotFoundError(f"the input file {batch.input_file_id} of batch {batch.id} is gone")
    return name
