"""Builders for the data lifecycle sweeps' tests (tests/batches/results/test_retention.py, tests/files/test_retention.py,
tests/files/test_storage_gc.py): batches run for real through the services with the fake backend, so parts,
results and events are the ones production writes; time is moved by passing a later ``now`` to the sweeps."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from controlplane.batches import services
from controlplane.batches.models import Batch, Shard
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_storage
from controlplane.tenants.models import Tenant
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

GRACE = timedelta(hours=1)


def sweep_settings(settings: Any, monkeypatch: Any) -> None:
    """No broker (the sweeps and runs are called directly), small shards, an hour's grace, 30 days' history."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4
    settings.STORAGE_GC_GRACE_SECONDS = int(GRACE.total_seconds())
    settings.BATCH_RETENTION_DAYS = 30


def ran_batch(tenant: Tenant, lines: int = 6, *, run: int | None = None, **create: Any) -> Batch:
    """A validated batch with ``run`` of its shards run (all of them by default)."""
    file = upload(tenant, jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(lines)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h", **create
    )
    services.batch_validate(batch_id=batch.id)
    backend = FakeBackend()
    for shard in list(Shard.objects.filter(batch=batch).order_by("index"))[:run]:
        assert run_shard(shard, backend) == "succeeded"
    return Batch.objects.get(id=batch.id)


def blob_exists(name: str) -> bool:
    return blob_storage().exists(name)


def all_blobs() -> set[str]:
    storage = blob_storage()
    found: set[str] = set()
    for prefix in ("files", "results", "parts", "other"):
        if not storage.exists(prefix):
            continue
        directories, names = storage.listdir(prefix)
        found.update(f"{prefix}/{name}" for name in names)
        for directory in directories:
            found.update(f"{prefix}/{directory}/{name}" for name in storage.listdir(f"{prefix}/{directory}")[1])
    return found


def named_blobs() -> set[str]:
    files = set(File.objects.values_list("storage_name", flat=True))
    return files | set(Shard.objects.exclude(part_name="").values_list("part_name", flat=True))
