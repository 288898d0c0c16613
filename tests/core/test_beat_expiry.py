"""Beat's messages (controlplane/core/messaging/beat.py, settings/__init__.py): a message that a later run of its job has
superseded is skipped, and a queue longer than every interval still runs each job. The expiry only bounds a
stopped worker's queue. The rules are stated per job, then checked on messages that Celery beat's own scheduler
sends into an in-memory broker and a worker's request executes."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from celery.beat import Scheduler
from celery.worker.request import Request
from django.conf import settings
from django.utils import timezone
from kombu import Connection

from controlplane.celery import app
from controlplane.core.messaging.beat import BeatAwareTask, beat_message_superseded
from controlplane.core.models import BeatRun

RECONCILE = "fleet.reconcile"


@pytest.fixture(autouse=True, scope="module")
def _tasks_registered() -> None:
    app.loader.import_default_modules()  # the apps' tasks modules, as a worker imports them at start


def _interval(entry: dict) -> float:
    every = entry["schedule"]
    return every.total_seconds() if isinstance(every, timedelta) else float(every)


def _expires(task_name: str, sent_at: datetime) -> str:
    """The expiry header beat writes on a message of the job sent at `sent_at`."""
    expiry = next(e["options"]["expires"] for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == task_name)
    return (sent_at + timedelta(seconds=expiry)).isoformat()


def test_every_beat_message_expires_far_beyond_its_interval():
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        expires = entry["options"]["expires"]
        assert expires == max(settings.BEAT_MESSAGE_EXPIRY_SECONDS, 2 * _interval(entry)), name
        # The old rule (expire after one interval) stopped every job once the queue was that long.
        assert expires >= 600, name


def test_every_scheduled_job_runs_through_the_superseding_guard():
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert isinstance(app.tasks[entry["task"]], BeatAwareTask), name


@pytest.mark.django_db
def test_a_message_sent_before_the_jobs_last_start_is_skipped():
    t0 = timezone.now() - timedelta(seconds=30)

    def at(seconds: float) -> datetime:
        return t0 + timedelta(seconds=seconds)

    assert not beat_message_superseded(RECONCILE, _expires(RECONCILE, at(0)), now=at(1))
    # Sent before that start: superseded. Sent after it: runs, and moves the start on.
    assert beat_message_superseded(RECONCILE, _expires(RECONCILE, at(0.5)), now=at(1.2))
    assert not beat_message_superseded(RECONCILE, _expires(RECONCILE, at(1.5)), now=at(2))
    assert BeatRun.objects.get(name=RECONCILE).started_at == at(2)
    assert beat_message_superseded(RECONCILE, _expires(RECONCILE, at(1.9)), now=at(2.5))
    assert BeatRun.objects.get(name=RECONCILE).started_at == at(2)


@pytest.mark.django_db
def test_a_queue_longer_than_every_interval_still_runs_each_job_once_per_pass():
    """60 s of reconcile messages, one a second, all taken now (a worker a minute behind beat): the first runs,
    the 59 it superseded are skipped; the next message beat sends runs. Each is older than the job's 10 s
    interval, so the old rule dropped every one of them and the reconciler never ran."""
    now = timezone.now()
    sent = [now - timedelta(seconds=60 - i) for i in range(60)]
    ran = [
        not beat_message_superseded(RECONCILE, _expires(RECONCILE, s), now=now + timedelta(milliseconds=i))
        for i, s in enumerate(sent)
    ]
    assert ran == [True] + [False] * 59
    later = now + timedelta(seconds=1)
    assert not beat_message_superseded(RECONCILE, _expires(RECONCILE, later), now=later + timedelta(seconds=1))


@pytest.mark.django_db
def test_a_task_sent_any_other_way_always_runs_and_records_nothing():
    now = timezone.now()
    assert not beat_message_superseded(RECONCILE, None, now=now)
    assert not beat_message_superseded(
        "batches.batch_validate", _expires(RECONCILE, now - timedelta(seconds=1)), now=now
    )
    assert not BeatRun.objects.exists()


def _beat_messages(task_name: str, n: int) -> list:
    """n messages of the job as beat sends them, taken off an in-memory broker of the test's own (the app's
    producer pool would reach the test Redis)."""
    scheduler = Scheduler(app, lazy=True)
    name, conf = next((k, v) for k, v in settings.CELERY_BEAT_SCHEDULE.items() if v["task"] == task_name)
    entry = scheduler.Entry(name=name, app=app, **conf)
    messages = []
    with Connection("memory://") as broker:
        queue = broker.SimpleQueue(app.amqp.router.route({}, entry.task)["queue"].name)  # declared and bound
        for _ in range(n):
            before = datetime.now().astimezone()
            result = scheduler.apply_async(entry, producer=broker.Producer())
            message = queue.get(timeout=5)
            message.ack()
            assert message.headers["id"] == result.id, name
            ahead = (datetime.fromisoformat(message.headers["expires"]) - before).total_seconds()
            assert entry.options["expires"] - 5 <= ahead <= entry.options["expires"] + 5, (name, ahead)
            messages.append(message)
        queue.close()
    return messages


def test_beat_sends_each_job_with_an_absolute_expiry_that_far_ahead():
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        _beat_messages(entry["task"], 1)


@pytest.mark.django_db(transaction=True)
def test_a_worker_skips_the_older_of_two_queued_beat_messages():
    """Two pruner messages queued before either ran: the worker runs the first (its result, the rows deleted)
    and skips the second (None); the pruner is the cheapest job to run for real."""
    prune = "core.idempotency_records_prune"
    first, second = _beat_messages(prune, 2)
    task = app.tasks[prune]
    assert Request(first, app=app, task=task).execute() == 0
    assert Request(second, app=app, task=task).execute() is None
    (third,) = _beat_messages(prune, 1)
    assert Request(third, app=app, task=task).execute() == 0
