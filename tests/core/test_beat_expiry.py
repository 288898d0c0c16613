"""Beat's messages expire after their own interval (controlplane/settings/__init__.py says why): a control worker
slower than beat drops the superseded ones instead of queueing them ahead of validations for good. The first
test states the rule per job; the second sends each job through Celery beat's own scheduler and reads the expiry
on the message as the broker receives it."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
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


@pytest.fixture
def broker(monkeypatch):
    """An in-memory broker for the sends (the app's own transport would reach the test Redis)."""
    with Connection("memory://") as connection:
        monkeypatch.setattr(app, "connection_for_write", lambda *a, **kw: connection)
        yield connection


def test_beat_sends_each_job_with_an_absolute_expiry_that_far_ahead(broker):
    scheduler = Scheduler(app, lazy=True)
    for name, conf in settings.CELERY_BEAT_SCHEDULE.items():
        entry = scheduler.Entry(name=name, app=app, **conf)
        with app.producer_or_acquire() as producer:
            before = datetime.now().astimezone()
            result = scheduler.apply_async(entry, producer=producer)
        queue = broker.SimpleQueue(app.amqp.router.route({}, entry.task)["queue"].name)
        message = queue.get(timeout=5)
        expires = datetime.fromisoformat(message.headers["expires"])
        message.ack()
        queue.close()
        assert message.headers["id"] == result.id, name
        ahead = (expires - before).total_seconds()
        assert entry.options["expires"] - 5 <= ahead <= entry.options["expires"] + 5, (name, ahead)
