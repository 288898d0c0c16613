"""Data lifecycle sweeps (batches/retention.py, batches/storage_gc.py), called as beat calls them.

Batches are run for real through the services with the fake backend, so parts, results and events are the
ones production writes; time is moved by passing a later ``now`` to the sweeps."""

from __future__ import annotations

import io
import random
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.batches import retention, services, storage_gc, tasks
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.core import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_save, blob_storage
from tests.batches.helpers import embedding_line, jsonl, upload
from tests.fakes import FakeBackend
from tests.running import run_batch, run_shard

pytestmark = pytest.mark.django_db(transaction=True)

GRACE = timedelta(hours=1)


@pytest.fixture
def eager(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4
    settings.STORAGE_GC_GRACE_SECONDS = int(GRACE.total_seconds())
    settings.BATCH_RETENTION_DAYS = 30


def _batch(tenant, lines: int = 6, *, run: int | None = None, **create) -> Batch:
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


def _exists(name: str) -> bool:
    return blob_storage().exists(name)


def _all_blobs() -> set[str]:
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


def _named_blobs() -> set[str]:
    files = set(File.objects.values_list("storage_name", flat=True))
    return files | set(Shard.objects.exclude(part_name="").values_list("part_name", flat=True))


class TestFileExpiry:
    def test_expired_files_are_deleted_row_and_blob(self, tenant, eager):
        now = timezone.now()
        gone, kept, forever = (upload(tenant, b'{"a": 1}\n') for _ in range(3))
        File.objects.filter(id=gone.id).update(expires_at=now - timedelta(seconds=1))
        File.objects.filter(id=kept.id).update(expires_at=now + timedelta(hours=1))
        assert retention.files_expire(now=now) == [gone.id]
        assert set(File.objects.values_list("id", flat=True)) == {kept.id, forever.id}
        assert not _exists(gone.storage_name) and _exists(kept.storage_name)

    def test_an_input_file_of_a_live_batch_survives_until_the_batch_ends(self, tenant, eager):
        batch = _batch(tenant, run=1)  # in_progress: one of two shards done
        assert batch.status == BatchStatus.IN_PROGRESS
        now = timezone.now()
        File.objects.filter(id=batch.input_file_id).update(expires_at=now - timedelta(hours=1))
        assert retention.files_expire(now=now) == []
        input_file = File.objects.get(id=batch.input_file_id)
        assert _exists(input_file.storage_name)
        # The batch still reads it to the end, and its finalizer too.
        run_batch(batch, FakeBackend())
        assert Batch.objects.get(id=batch.id).status == BatchStatus.COMPLETED
        assert retention.files_expire(now=timezone.now()) == [input_file.id]
        assert not _exists(input_file.storage_name)

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
        batch = _batch(tenant, lines=2)
        assert File.objects.get(id=batch.output_file_id).expires_at is None


class TestHistoryPrune:
    def test_events_and_shards_of_long_ended_batches_go_the_batch_row_stays(self, tenant, eager):
        old = _batch(tenant)
        recent = _batch(tenant)
        live = _batch(tenant, run=1)
        assert Shard.objects.filter(batch=old).count() == 2 and BatchEvent.objects.filter(batch=old).exists()
        Batch.objects.filter(id=old.id).update(completed_at=timezone.now() - timedelta(days=31))
        Batch.objects.filter(id=recent.id).update(completed_at=timezone.now() - timedelta(days=29))
        # A live batch is never pruned, however old its rows.
        Batch.objects.filter(id=live.id).update(created_at=timezone.now() - timedelta(days=90))

        pruned = retention.history_prune(now=timezone.now())

        assert pruned["shards"] == 2 and pruned["events"] > 0
        assert not Shard.objects.filter(batch=old).exists() and not BatchEvent.objects.filter(batch=old).exists()
        kept = Batch.objects.get(id=old.id)
        assert (kept.status, kept.total_lines, kept.completed_lines) == (BatchStatus.COMPLETED, 6, 6)
        assert File.objects.filter(id=kept.output_file_id).exists()
        for batch in (recent, live):
            assert Shard.objects.filter(batch=batch).exists() and BatchEvent.objects.filter(batch=batch).exists()
        assert retention.history_prune(now=timezone.now()) == {"events": 0, "shards": 0}

    def test_each_terminal_state_counts_from_its_own_stamp(self, tenant, eager):
        long_ago = timezone.now() - timedelta(days=40)
        batches = {status: _batch(tenant, lines=2) for status in ("failed", "expired", "cancelled")}
        for status, batch in batches.items():
            Batch.objects.filter(id=batch.id).update(status=status, **{f"{status}_at": long_ago})
        retention.history_prune(now=timezone.now())
        assert not Shard.objects.filter(batch__in=batches.values()).exists()

    def test_deletes_in_chunks_and_stops_at_the_run_limit(self, tenant, eager, monkeypatch):
        old = _batch(tenant, lines=12)  # 3 shards, more than 5 events
        Batch.objects.filter(id=old.id).update(completed_at=timezone.now() - timedelta(days=31))
        events = BatchEvent.objects.filter(batch=old).count()
        assert events > 5
        monkeypatch.setattr(retention, "DELETE_CHUNK", 2)
        with CaptureQueriesContext(connection) as queries:
            assert retention.history_prune(now=timezone.now(), limit=5) == {"events": 5, "shards": 3}
        deletes = [q["sql"].split()[2] for q in queries.captured_queries if q["sql"].startswith("DELETE")]
        # One statement per chunk of DELETE_CHUNK rows, never past the limit: 2 + 2 + 1 events, 2 + 1 shards.
        assert deletes == ['"batches_batchevent"'] * 3 + ['"batches_shard"'] * 2
        assert BatchEvent.objects.filter(batch=old).count() == events - 5


class TestStorageCollector:
    def test_parts_of_ended_batches_go_after_the_grace_period(self, tenant, eager):
        done = _batch(tenant)
        live = _batch(tenant, run=1)
        done_parts = list(Shard.objects.filter(batch=done).values_list("part_name", flat=True))
        live_parts = list(Shard.objects.filter(batch=live).exclude(part_name="").values_list("part_name", flat=True))
        assert len(done_parts) == 2 and len(live_parts) == 1 and all(map(_exists, done_parts + live_parts))

        assert storage_gc.parts_collect(now=timezone.now()) == 0  # ended moments ago: within the grace
        assert storage_gc.parts_collect(now=timezone.now() + GRACE + timedelta(seconds=1)) == 2
        assert not any(map(_exists, done_parts)) and all(map(_exists, live_parts))
        assert set(Shard.objects.filter(batch=done).values_list("part_name", flat=True)) == {""}
        # The output is whole without them.
        assert File.objects.get(id=Batch.objects.get(id=done.id).output_file_id).bytes > 0

    def test_orphans_go_after_the_grace_period_live_blobs_never(self, tenant, eager):
        done = _batch(tenant)
        _batch(tenant, run=1)
        orphan_upload = blob_save(f"files/{tenant.id}/file-crashed-before-its-row", io.BytesIO(b"x"))
        stale_part = blob_save(f"parts/{done.id}/000000.attempt9.jsonl", io.BytesIO(b"x"))
        not_ours = blob_save("other/keep-me", io.BytesIO(b"x"))
        named = _named_blobs()
        assert len(named) == 6  # two inputs, one output, three committed parts

        assert storage_gc.orphans_collect(now=timezone.now()) == []  # all written just now

        later = timezone.now() + GRACE + timedelta(seconds=1)
        assert sorted(storage_gc.orphans_collect(now=later)) == sorted([orphan_upload, stale_part])
        assert _all_blobs() == named | {not_ours}
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
        assert _exists(name)

    def test_a_run_looks_at_a_bounded_number_of_blobs(self, tenant, eager):
        orphans = [blob_save(f"files/{tenant.id}/orphan-{i}", io.BytesIO(b"x")) for i in range(5)]
        later = timezone.now() + GRACE * 2
        first = storage_gc.orphans_collect(now=later, scan_limit=2, rng=random.Random(1))
        assert len(first) == 2
        rest = storage_gc.orphans_collect(now=later, scan_limit=100)
        assert sorted(first + rest) == sorted(orphans)

    def test_empty_part_directories_of_ended_batches_are_removed(self, tenant, eager, storage_dir):
        done = _batch(tenant)
        live = _batch(tenant, run=1)
        later = timezone.now() + GRACE * 2
        storage_gc.parts_collect(now=later)
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


def test_beat_runs_the_lifecycle_tasks(tenant, eager, settings):
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"batches.files_expire", "batches.history_prune", "batches.storage_collect"} <= names
    expired = upload(tenant, b'{"a": 1}\n')
    File.objects.filter(id=expired.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    old = _batch(tenant, lines=2)
    Batch.objects.filter(id=old.id).update(completed_at=timezone.now() - timedelta(days=31))
    assert tasks.files_expire_task() == 1
    assert tasks.history_prune_task()["shards"] == 1
    # The pruned shard named a part: the collector finds it an orphan once it is past the grace period.
    assert tasks.storage_collect_task() == 0
