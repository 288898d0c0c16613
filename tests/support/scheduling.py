"""Builders for scheduler tests: validated batches of the identity model owned by given tenants."""

from __future__ import annotations

from controlplane.batches import services
from controlplane.batches.models import Batch
from controlplane.tenants.models import Tenant
from controlplane.tenants.services import tenant_create
from tests.support.batches import jsonl, tensor_line, upload


def new_tenant(name: str, **fields: object) -> Tenant:
    tenant, _ = tenant_create(name=name)
    if fields:
        Tenant.objects.filter(id=tenant.id).update(**fields)
        tenant.refresh_from_db()
    return tenant


def runnable_batch(tenant: Tenant, lines: int, *, prefix: str = "r", priority: str | None = None) -> Batch:
    """An in_progress identity batch (one row per line); shard size follows settings.SHARD_MAX_LINES."""
    content = jsonl([tensor_line(f"{prefix}{i}", [[float(i), 0.0, 0.0, 0.0]]) for i in range(lines)])
    file = upload(tenant, content)
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h", priority=priority
    )
    services.batch_validate(batch_id=batch.id)
    batch.refresh_from_db()
    assert batch.status == "in_progress", batch.errors
    return batch
