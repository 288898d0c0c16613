"""The batch pipeline's data lifecycle sweeps (batches/results/retention.py: history pruning, part blobs of ended
batches) and beat's lifecycle tasks, called as beat calls them (tests/support/sweeps.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.batches import tasks
from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard
from controlplane.batches.results import retention
from controlplane.files import tasks as files_tasks
from controlplane.files.models import File
from tests.support.batches import upload
from tests.support.sweeps import GRACE, blob_exists, ran_batch, sweep_settings

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager(settings, monkeypatch):
    sweep_settings(settings, monkeypatch)


class TestHistoryPrune:
    def test_events_and_shards_of_long_ended_batches_go_the_batch_row_stays(self, tenant, eager):
        old = ran_batch(tenant)
        recent = ran_batch(tenant)
        live = ran_batch(tenant, run=1)
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
        batches = {status: ran_batch(tenant, lines=2) for status in ("failed", "expired", "cancelled")}
        for status, batch in batches.items():
            Batch.objects.filter(id=batch.id).update(status=status, **{f"{status}_at": long_ago})
        retention.history_prune(now=timezone.now())
        assert not Shard.objects.filter(batch__in=batches.values()).exists()

    def test_deletes_in_chunks_and_stops_at_the_run_limit(self, tenant, eager, monkeypatch):
        old = ran_batch(tenant, lines=12)  # 3 shards, more than 5 events
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


class TestPartsCollector:
    def test_parts_of_ended_batches_go_after_the_grace_period(self, tenant, eager):
        done = ran_batch(tenant)
        live = ran_batch(tenant, run=1)
        done_parts = list(Shard.objects.filter(batch=done).values_list("part_name", flat=True))
        live_parts = list(Shard.objects.filter(batch=live).exclude(part_name="").values_list("part_name", flat=True))
        assert len(done_parts) == 2 and len(live_parts) == 1 and all(map(blob_exists, done_parts + live_parts))

        assert retention.parts_collect(now=timezone.now()) == 0  # ended moments ago: within the grace
        assert retention.parts_collect(now=timezone.now() + GRACE + timedelta(seconds=1)) == 2
        assert not any(map(blob_exists, done_parts)) and all(map(blob_exists, live_parts))
        assert set(Shard.objects.filter(batch=done).values_list("part_name", flat=True)) == {""}
        # The output is whole without them.
        assert File.objects.get(id=Batch.objects.get(id=done.id).output_file_id).bytes > 0


def test_beat_runs_the_lifecycle_tasks(tenant, eager, settings):
    names = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert {"batches.files_expire", "batches.history_prune", "batches.storage_collect"} <= names
    expired = upload(tenant, b'{"a": 1}\n')
    File.objects.filter(id=expired.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    old = ran_batch(tenant, lines=2)
    Batch.objects.filter(id=old.id).update(completed_at=timezone.now() - timedelta(days=31))
    assert files_tasks.files_expire_task() == 1
    assert tasks.history_prune_task()["shards"] == 1
    # The pruned shard named a part: the collector finds it an orphan once it is past the grace period.
    assert tasks.storage_collect_task() == 0
