"""File expiry (files/retention.py), called as beat calls it; the batch pipeline's inputs and results come from
batches run for real (tests/support/sweeps.py), so the in-use hook it asks is the registered one (batches/results/file_use.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus
from controlplane.files import retention
from controlplane.files.models import File
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch
from tests.support.sweeps import blob_exists, ran_batch, sweep_settings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager(settings, monkeypatch):
    sweep_settings(settings, monkeypatch)


class TestFileExpiry:
    def test_expired_files_are_deleted_row_and_blob(self, tenant, eager):
        now = timezone.now()
        gone, kept, forever = (upload(tenant, b'{"a": 1}\n') for _ in range(3))
        File.objects.filter(id=gone.id).update(expires_at=now - timedelta(seconds=1))
        File.objects.filter(id=kept.id).update(expires_at=now + timedelta(hours=1))
        assert retention.files_expire(now=now) == [gone.id]
        assert set(File.objects.values_list("id", flat=True)) == {kept.id, forever.id}
        assert not blob_exists(gone.storage_name) and blob_exists(kept.storage_name)

    def test_an_input_file_of_a_live_batch_survives_until_the_batch_ends(self, tenant, eager):
        batch = ran_batch(tenant, run=1)  # in_progress: one of two shards done
        assert batch.status == BatchStatus.IN_PROGRESS
        now = timezone.now()
        File.objects.filter(id=batch.input_file_id).update(expires_at=now - timedelta(hours=1))
        assert retention.files_expire(now=now) == []
        input_file = File.objects.get(id=batch.input_file_id)
        assert blob_exists(input_file.storage_name)
        # The batch still reads it to the end, and its finalizer too.
        run_batch(batch, FakeBackend())
        assert Batch.objects.get(id=batch.id).status == BatchStatus.COMPLETED
        assert retention.files_expire(now=timezone.now()) == [input_file.id]
        assert not blob_exists(input_file.storage_name)

    def test_a_run_is_bounded(self, tenant, eager):
        now = timezone.now()
        files = [upload(tenant, b'{"a": 1}\n') for _ in range(3)]
        File.objects.filter(id__in=[f.id for f in files]).update(expires_at=now - timedelta(minutes=1))
        assert len(retention.files_expire(now=now, limit=2)) == 2
        assert len(retention.files_expire(now=now, limit=2)) == 1

    def test_results_expire_after_output_expires_after(self, tenant, eager):
        lines = [embedding_line("ok", "fine"), embedding_line("bad", "REJECT this")]
        file = upload(tenant, jsonl(lines))
        batch = services.batch_create(
            tenant=tenant,
            input_file_id=file.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": 7200},
        )
        services.batch_validate(batch_id=batch.id)
        run_batch(batch, FakeBackend())
        batch = Batch.objects.get(id=batch.id)
        assert batch.status == BatchStatus.COMPLETED and batch.output_expires_after == 7200
        results = File.objects.filter(id__in=[batch.output_file_id, batch.error_file_id])
        assert results.count() == 2
        for result in results:
            assert result.expires_at == result.created_at + timedelta(seconds=7200)
        assert File.objects.get(id=file.id).expires_at is None  # the input keeps its own policy
        assert retention.files_expire(now=timezone.now() + timedelta(seconds=3600)) == []
        expired = retention.files_expire(now=timezone.now() + timedelta(seconds=7201))
        assert sorted(expired) == sorted([batch.output_file_id, batch.error_file_id])
        assert not File.objects.filter(purpose=File.Purpose.BATCH_OUTPUT).exists()

    def test_without_output_expires_after_results_are_kept(self, tenant, eager):
        batch = ran_batch(tenant, lines=2)
        assert File.objects.get(id=batch.output_file_id).expires_at is None
