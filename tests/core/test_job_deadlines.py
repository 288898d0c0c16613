"""Deadlines of beat's jobs and finalize (core/workers/deadlines.py): they run on thread pools, which ignore Celery's
time limits, so each bounds itself: a statement timeout on its connection and a budget its loops read. A job past
its deadline stops between items, and its next run continues; a finalizer past its own deadline publishes nothing
and the stale-finalizer rescue starts it again."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.utils import timezone

from controlplane.batches import services, tasks
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results import finalize
from controlplane.celery import app
from controlplane.core.messaging import dispatch
from controlplane.core.workers.deadlines import (
    job_deadline_begin,
    job_deadline_on_task_start,
    job_deadline_seconds,
    job_time_up,
)
from tests.batches.test_lifecycle import _create
from tests.support.batches import embedding_line
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _no_deadline_left_behind():
    yield
    job_deadline_begin(seconds=None)


@pytest.fixture
def sent(monkeypatch) -> list[tuple[str, list]]:
    messages: list[tuple[str, list]] = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args, **options: messages.append((task_name, args)))
    return messages


def _statement_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return cursor.fetchone()[0]


def test_every_beat_job_and_finalize_is_bounded_and_nothing_else():
    app.loader.import_default_modules()
    beat = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    bounded = {name for name in app.tasks if job_deadline_seconds(name) is not None}
    assert bounded == beat | {dispatch.FINALIZE}
    assert job_deadline_seconds(dispatch.VALIDATE) is None  # its own deadline, and the process pool's time limit
    assert job_deadline_seconds(dispatch.SLOT) is None  # its slot budget


def test_a_bounded_task_runs_under_a_statement_timeout_and_the_next_task_without(settings):
    assert connection.vendor == "postgresql"
    settings.JOB_DEADLINE_SECONDS = 7
    job_deadline_on_task_start(task=app.tasks["batches.batches_expire"])
    assert _statement_timeout() == "7s"
    assert not job_time_up()
    job_deadline_on_task_start(task=app.tasks[dispatch.VALIDATE])
    assert _statement_timeout() == "0" and not job_time_up()


def test_a_statement_past_the_deadline_is_cancelled():
    job_deadline_begin(seconds=0.2)
    with pytest.raises(OperationalError, match="statement timeout"), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(2)")


def test_a_job_past_its_deadline_stops_between_items_and_the_next_run_continues(tenant, sent):
    batches = [_create(tenant, [embedding_line("r0", "text")]) for _ in range(3)]
    Batch.objects.filter(id__in=[b.id for b in batches]).update(expires_at=timezone.now() - timedelta(seconds=1))
    job_deadline_begin(seconds=0)  # already past: nothing is started
    assert job_time_up()
    assert tasks.batches_expire_task() == 0
    job_deadline_begin(seconds=60)
    assert tasks.batches_expire_task() == 3  # the next run does them all


def test_a_finalizer_that_lost_its_batch_publishes_nothing_and_its_restart_finishes(
    tenant, sent, settings, monkeypatch
):
    settings.SHARD_MAX_LINES = 2
    settings.FINALIZE_STALE_SECONDS = 60  # a finalizer renews its hold by 54 s, before the rescuer's 60
    batch = _create(tenant, [embedding_line(f"r{i}", "text") for i in range(4)])
    services.batch_validate(batch_id=batch.id)
    first, last = Shard.objects.filter(batch=batch).order_by("index")
    assert run_shard(first, FakeBackend()) == "succeeded"
    # The last commit's finalizer starts 57 s after the batch became finalizing, and the rescuer has restarted
    # the batch meanwhile (a new finalizing_at): its renewal, due at once, finds the batch no longer its own.
    real_finalizing, real_entries = finalize.batch_finalizing, finalize.shard_entries
    monkeypatch.setattr(
        finalize,
        "batch_finalizing",
        lambda *, batch_id, now: real_finalizing(batch_id=batch_id, now=now - timedelta(seconds=57)),
    )

    def entries_after_a_restart(batch, shard, lost):
        Batch.objects.filter(id=batch.id).update(finalizing_at=timezone.now())
        return real_entries(batch, shard, lost)

    monkeypatch.setattr(finalize, "shard_entries", entries_after_a_restart)
    assert run_shard(last, FakeBackend()) == "succeeded"
    monkeypatch.setattr(finalize, "batch_finalizing", real_finalizing)
    monkeypatch.setattr(finalize, "shard_entries", real_entries)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.FINALIZING and batch.output_file_id is None
    assert Shard.objects.filter(batch=batch, status=ShardStatus.SUCCEEDED).count() == 2
    # Once stale, the rescuer takes it again and sends it to the control queue, whose finalizer finishes it.
    Batch.objects.filter(id=batch.id).update(finalizing_at=timezone.now() - timedelta(seconds=61))
    sent.clear()
    assert finalize.batches_finalize_stuck() == [batch.id]
    assert sent == [(dispatch.FINALIZE, [batch.id, True])]
    tasks.batch_finalize_task(batch.id, True)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == 4


def test_a_finalizer_that_outlasts_the_stale_limit_renews_its_hold_and_finishes(tenant, sent, settings, monkeypatch):
    # Results that take longer to write than FINALIZE_STALE_SECONDS: one finalizer moves finalizing_at forward as
    # it goes and finishes, instead of stopping at its deadline to be restarted from the first part, forever.
    settings.SHARD_MAX_LINES = 4
    settings.FINALIZE_STALE_SECONDS = 2  # renewed every 0.5 s; without renewal it would stop at 1.8 s
    batch = _create(tenant, [embedding_line(f"r{i}", "text") for i in range(8)])
    services.batch_validate(batch_id=batch.id)
    first, last = Shard.objects.filter(batch=batch).order_by("index")
    assert run_shard(first, FakeBackend()) == "succeeded"
    real_entries = finalize.shard_entries
    renewals: list[object] = []

    def slow_entries(batch, shard, lost):
        for entry in real_entries(batch, shard, lost):
            time.sleep(0.4)  # 8 lines: 3.2 s of merging
            renewals.append(Batch.objects.filter(id=batch.id).values_list("finalizing_at", flat=True).get())
            yield entry

    monkeypatch.setattr(finalize, "shard_entries", slow_entries)
    assert run_shard(last, FakeBackend()) == "succeeded"
    batch = Batch.objects.get(id=batch.id)
    assert (batch.status, batch.completed_lines) == (BatchStatus.COMPLETED, 8)
    assert len(set(renewals)) >= 4, renewals  # its hold moved forward as it merged
