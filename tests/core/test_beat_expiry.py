"""Beat's messages expire after their own interval (controlplane/settings/__init__.py says why): a control worker
slower than beat drops the superseded ones instead of queueing them ahead of validations for good. The first
test states the rule per job; the second sends each job through Celery beat's own scheduler and reads the expiry
on the message as the broker receives it."""

from __future__ import annotations

from datetime import datetime, timedelta

from celery.beat import Scheduler
from django.conf import settings
from kombu import Connection

from controlplane.celery import app


def _interval(entry: dict) -> float:
    every = entry["schedule"]
    return every.total_seconds() if isinstance(every, timedelta) else float(every)


def test_every_beat_job_expires_after_its_interval_never_sooner_than_the_floor():
    floor = settings.BEAT_MESSAGE_MIN_EXPIRY_SECONDS
    assert floor >= 5, "a few seconds of clock difference between beat's host and a worker's must not drop jobs"
    for name, entry in settings.CELERY_BEAT_SCHEDULE.items():
        assert entry["options"]["expires"] == max(_interval(entry), floor), name


def test_beat_sends_each_job_with_an_absolute_expiry_that_far_ahead():
    scheduler = Scheduler(app, lazy=True)
    # An in-memory broker of the test's own: the app's producer pool would reach the test Redis.
    with Connection("memory://") as broker:
        for name, conf in settings.CELERY_BEAT_SCHEDULE.items():
            entry = scheduler.Entry(name=name, app=app, **conf)
            queue = broker.SimpleQueue(app.amqp.router.route({}, entry.task)["queue"].name)  # declared and bound
            before = datetime.now().astimezone()
            result = scheduler.apply_async(entry, producer=broker.Producer())
            message = queue.get(timeout=5)
            message.ack()
            queue.close()
            assert message.headers["id"] == result.id, name
            ahead = (datetime.fromisoformat(message.headers["expires"]) - before).total_seconds()
            assert entry.options["expires"] - 5 <= ahead <= entry.options["expires"] + 5, (name, ahead)
