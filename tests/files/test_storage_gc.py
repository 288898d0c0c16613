"""The orphan collector (files/storage_gc.py) on local storage, with the batch pipeline's part blobs named by its
registered hook (batches/results/file_use.py); batches are run for real (tests/support/sweeps.py). On S3: test_storage_gc_s3.py."""

from __future__ import annotations

import io
import random
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches.models import Shard
from controlplane.batches.results import retention
from controlplane.files import storage_gc
from controlplane.files.models import File
from controlplane.files.storage import blob_save
from tests.support.sweeps import GRACE, all_blobs, blob_exists, named_blobs, ran_batch, sweep_settings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager(settings, monkeypatch):
    sweep_settings(settings, monkeypatch)


class TestOrphanCollector:
    def test_orphans_go_after_the_grace_period_live_blobs_never(self, tenant, eager):
        done = ran_batch(tenant)
        ran_batch(tenant, run=1)
        orphan_upload = blob_save(f"files/{tenant.id}/file-crashed-before-its-row", io.BytesIO(b"x"))
        stale_part = blob_save(f"parts/{done.id}/000000.attempt9.jsonl", io.BytesIO(b"x"))
        not_ours = blob_save("other/keep-me", io.BytesIO(b"x"))
        named = named_blobs()
        assert len(named) == 6  # two inputs, one output, three committed parts

        assert storage_gc.orphans_collect(now=timezone.now()) == []  # all written just now

        later = timezone.now() + GRACE + timedelta(seconds=1)
        assert sorted(storage_gc.orphans_collect(now=later)) == sorted([orphan_upload, stale_part])
        assert all_blobs() == named | {not_ours}
        assert storage_gc.orphans_collect(now=later) == []

    def test_a_blob_a_row_comes_to_name_is_kept(self, tenant, eager, monkeypatch):
        """The last lookup runs right before the deletes: a row committed after the first one keeps its
        blob (the grace period makes this a very late row; the check makes it harmless)."""
        name = blob_save(f"files/{tenant.id}/file-late-row", io.BytesIO(b'{"a": 1}\n'))
        real_named = storage_gc._named

        def row_appears_between_lookups(blobs, *, directory=None):
            if directory is None:  # the second lookup
                File.objects.create(
                    id="file-late-row", tenant=tenant, filename="x", purpose="batch", bytes=9, storage_name=name
                )
            return real_named(blobs, directory=directory)

        monkeypatch.setattr(storage_gc, "_named", row_appears_between_lookups)
        assert storage_gc.orphans_collect(now=timezone.now() + GRACE * 2) == []
        assert blob_exists(name)

    def test_a_run_looks_at_a_bounded_number_of_blobs(self, tenant, eager):
        orphans = [blob_save(f"files/{tenant.id}/orphan-{i}", io.BytesIO(b"x")) for i in range(5)]
        later = timezone.now() + GRACE * 2
        first = storage_gc.orphans_collect(now=later, scan_limit=2, rng=random.Random(1))
        assert len(first) == 2
        rest = storage_gc.orphans_collect(now=later, scan_limit=100)
        assert sorted(first + rest) == sorted(orphans)

    def test_empty_part_directories_of_ended_batches_are_removed(self, tenant, eager, storage_dir):
        done = ran_batch(tenant)
        live = ran_batch(tenant, run=1)
        later = timezone.now() + GRACE * 2
        retention.parts_collect(now=later)
        done_dir, live_dir = storage_dir / "parts" / done.id, storage_dir / "parts" / live.id
        assert done_dir.is_dir() and not list(done_dir.iterdir())
        storage_gc.orphans_collect(now=timezone.now())
        assert done_dir.is_dir()  # emptied just now: within the grace period
        Shard.objects.filter(batch=live).update(part_name="")  # its committed part is now an orphan
        storage_gc.orphans_collect(now=later)
        assert not done_dir.exists()
        assert live_dir.is_dir() and not list(live_dir.iterdir())
        storage_gc.orphans_collect(now=later)
        assert live_dir.is_dir()  # empty and old, but its batch still runs and may write into it
