"""Beat's housekeeping messages: a message that a later run of its job has superseded is skipped, not run.

Beat sends every job on its interval whether or not the worker has taken the last one, so a control worker slower
than beat (a loaded host, a slow database) queues them up. A message is skipped when a run of the same job
started after the message was sent: that run already saw everything the message was sent for, and every beat job
is idempotent. However long the queue, each job then runs once per pass through it, and skipping costs one
UPDATE. The rule before this one expired a message after its own interval: once the queue was longer than the
interval, every message expired and nothing ran at all (a hog run: the heartbeat and the reconciler stopped, and
a restarted Triton never got its models back; docs/reliability.md).

A beat message is one of a task in CELERY_BEAT_SCHEDULE that carries an ``expires`` (beat sets it on every send,
settings/__init__.py; no other send does): its sent time is that expiry less the entry's expiry seconds. A task
called any other way (dispatch, the admin's "reconcile now", a test) always runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from celery import Task
from django.conf import settings
from django.utils import timezone

_NEVER = datetime(1970, 1, 1, tzinfo=UTC)


@cache
def _expiries() -> dict[str, float]:
    """task name → the expiry seconds beat sends it with (settings.CELERY_BEAT_SCHEDULE's options)."""
    return {entry["task"]: float(entry["options"]["expires"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()}


def _as_datetime(expires: Any) -> datetime | None:
    if isinstance(expires, datetime):
        return expires if expires.tzinfo else expires.replace(tzinfo=UTC)
    if isinstance(expires, str) and expires:
        return _as_datetime(datetime.fromisoformat(expires))
    return None


def beat_message_superseded(task_name: str, expires: Any, *, now: datetime | None = None) -> bool:
    """True when this message of a beat job was sent before the job's last run started (skip it); otherwise the
    job's start is recorded as now and False (run it). Not a beat message: False, nothing recorded."""
    expiry_s = _expiries().get(task_name)
    expires_at = _as_datetime(expires)
    if expiry_s is None or expires_at is None:
        return False
    sent_at = expires_at - timedelta(seconds=expiry_s)
    # Here, not at the top: the Celery app imports this module before Django's apps are ready.
    from controlplane.core.models import BeatRun

    now = now or timezone.now()
    # One statement decides: two workers holding two messages sent after the last start may both run (as
    # before; the jobs are idempotent), a message sent before it never does.
    if BeatRun.objects.filter(name=task_name, started_at__lt=sent_at).update(started_at=now):
        return False
    if BeatRun.objects.filter(name=task_name).exists():
        return True
    BeatRun.objects.bulk_create([BeatRun(name=task_name, started_at=_NEVER)], ignore_conflicts=True)
    return not BeatRun.objects.filter(name=task_name, started_at__lt=sent_at).update(started_at=now)


class BeatAwareTask(Task):
    """The app's task class (controlplane/celery.py): a superseded beat message returns None without running."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # The worker's request (pushed before this call) carries the message's expiry; Task.__call__ pushes its own.
        if beat_message_superseded(self.name, getattr(self.request, "expires", None)):
            return None
        return super().__call__(*args, **kwargs)
