"""Builders for the usage tests: real batches run through the services with the fake backend."""

from __future__ import annotations

from decimal import Decimal

from controlplane.batches import services
from controlplane.batches.models import Batch
from controlplane.fleet.models import CatalogueModel
from controlplane.tenants.models import Tenant
from controlplane.usage.models import Price
from tests.support.batches import embedding_line, jsonl, tensor_line, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch as run_shards_of


def embedding_lines(count: int, prefix: str = "r") -> list[dict]:
    return [embedding_line(f"{prefix}{i}", f"sentence {i} " + "word " * (i % 7)) for i in range(count)]


def tensor_lines(count: int) -> list[dict]:
    return [tensor_line(f"t{i}", [[float(i), 1.0, 2.0]] * (1 + i % 3)) for i in range(count)]


def run_batch(tenant: Tenant, lines: list[dict], endpoint: str = "/v1/embeddings") -> Batch:
    """Create, validate and run every shard of a batch; returns the finished batch."""
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint=endpoint, completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    run_shards_of(batch, FakeBackend())
    return Batch.objects.get(id=batch.id)


def price_set(model: str, *, tokens: str = "0", rows: str = "0", gpu_second: str = "0", **kw: object) -> Price:
    return Price.objects.create(
        model=CatalogueModel.objects.get(name=model),
        per_million_tokens=Decimal(tokens),
        per_thousand_rows=Decimal(rows),
        per_gpu_second=Decimal(gpu_second),
        **kw,
    )
