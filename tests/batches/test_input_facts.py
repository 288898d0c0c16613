"""The batch keeps what it needs of its input at create (Batch.input_storage_name, input_line_count), and the
pipeline reads the input's blob by that name, never through the file's row (docs/architecture/data-lifecycle.md,
"Files and batches, one boundary")."""

from __future__ import annotations

import importlib
import json

import pytest
from django.apps import apps

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch, run_shard

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4


def _create(tenant, lines: int = 8) -> tuple[Batch, File]:
    file = upload(tenant, jsonl([embedding_line(f"r{i}", f"text {i}") for i in range(lines)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    return batch, file


def _custom_ids(file_id: str | None) -> list[str]:
    with blob_open(File.objects.get(id=file_id).storage_name) as fh:
        return [json.loads(line)["custom_id"] for line in fh]


def test_create_keeps_the_inputs_blob_name_and_line_count(tenant, eager):
    batch, file = _create(tenant, lines=5)
    assert (batch.input_storage_name, batch.input_line_count) == (file.storage_name, 5)
    assert Batch.objects.values_list("input_storage_name", "input_line_count").get(id=batch.id) == (
        file.storage_name,
        5,
    )


def test_run_and_finalize_read_the_name_the_batch_kept(tenant, eager):
    """Once validated, the batch reads its input only by the kept name: a file row naming another blob changes
    nothing. One shard runs, the batch is cancelled, and finalization reads the other shard's lines from the
    input to write them as batch_cancelled errors."""
    batch, file = _create(tenant, lines=8)
    services.batch_validate(batch_id=batch.id)
    File.objects.filter(id=file.id).update(storage_name=f"files/{tenant.id}/not-the-input")
    first = Shard.objects.filter(batch=batch).order_by("index").first()
    assert run_shard(first, FakeBackend()) == "succeeded"
    services.batch_cancel(batch=Batch.objects.get(id=batch.id))
    batch_try_finalize(batch_id=batch.id)
    done = Batch.objects.get(id=batch.id)
    assert (done.status, done.completed_lines, done.failed_lines) == (BatchStatus.CANCELLED, 4, 4)
    assert _custom_ids(done.output_file_id) == ["r0", "r1", "r2", "r3"]
    assert _custom_ids(done.error_file_id) == ["r4", "r5", "r6", "r7"]


def test_a_batch_the_last_release_wrote_reads_its_files_name(tenant, eager):
    """A row inserted by the previous release during a rolling upgrade has no kept name (the column's database
    default): it is read by the name its file's row gives."""
    batch, _ = _create(tenant, lines=6)
    Batch.objects.filter(id=batch.id).update(input_storage_name="", input_line_count=None)
    services.batch_validate(batch_id=batch.id)
    run_batch(batch, FakeBackend())
    done = Batch.objects.get(id=batch.id)
    assert (done.status, done.completed_lines) == (BatchStatus.COMPLETED, 6)


def test_the_migration_fills_existing_rows_from_their_files(tenant, eager):
    kept, kept_file = _create(tenant, lines=3)
    gone, gone_file = _create(tenant, lines=2)
    File.objects.filter(id=gone_file.id).delete()  # the tenant deleted it after the batch ended
    Batch.objects.update(input_storage_name="", input_line_count=None)
    migration = importlib.import_module("controlplane.batches.migrations.0011_batch_input_facts")
    migration.backfill(apps, None)
    rows = dict(Batch.objects.values_list("id", "input_storage_name"))
    assert rows == {kept.id: kept_file.storage_name, gone.id: f"files/{tenant.id}/{gone_file.id}"}
    assert Batch.objects.get(id=kept.id).input_line_count == 3
    assert Batch.objects.get(id=gone.id).input_line_count is None
