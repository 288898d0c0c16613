"""Deadlines of beat's jobs and of finalize, which run on thread pools (housekeeping, control): Celery's time limits
are enforced by its process pool only, so each of these jobs bounds itself.

When such a task starts (task_prerun, controlplane/celery.py), its worker thread gets a deadline JOB_DEADLINE_SECONDS
away: its database connection's ``statement_timeout`` (a statement past it, a lock wait included, raises and ends
the job), and a wall-clock budget that the jobs' loops read (``job_time_up``) to stop between items. Every one of
these jobs is idempotent and takes up where the last run stopped (the rows it had not reached are still there), so
a job that stops at its deadline loses nothing: its next run continues. Finalize keeps, besides, a deadline of its
own tied to the stale-finalizer rescue (batches/results/finalize.py). Any other task runs with no statement
timeout."""

from __future__ import annotations

import time
from contextvars import ContextVar
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection

FINALIZE_TASK = "batches.batch_finalize"

_deadline: ContextVar[float | None] = ContextVar("job_deadline", default=None)


@cache
def _bounded_tasks() -> frozenset[str]:
    return frozenset({entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()} | {FINALIZE_TASK})


def job_deadline_seconds(task_name: str) -> float | None:
    """The deadline of a task's run, None for tasks that bound themselves otherwise (validation, slots, webhook
    attempts)."""
    return float(settings.JOB_DEADLINE_SECONDS) if task_name in _bounded_tasks() else None


def job_deadline_begin(*, seconds: float | None) -> None:
    """Start (or, with None, clear) the running thread's job deadline, and its connection's statement timeout."""
    _deadline.set(None if seconds is None else time.monotonic() + seconds)
    _statement_timeout(0 if seconds is None else max(1, int(seconds * 1000)))


def job_deadline_on_task_start(sender: Any = None, task: Any = None, **_: Any) -> None:
    """task_prerun: the task's own deadline, or none."""
    name = getattr(task or sender, "name", "") or ""
    job_deadline_begin(seconds=job_deadline_seconds(name))


def job_time_up() -> bool:
    """True once the running job's deadline has passed: stop before the next item (the next run does it)."""
    deadline = _deadline.get()
    return deadline is not None and time.monotonic() >= deadline


def _statement_timeout(milliseconds: int) -> None:
    if connection.vendor != "postgresql":
        return  # SQLite (the embedded default) has no statement timeout; the wall-clock budget still holds
    # Remembered on the driver's connection itself: a new connection starts at the server's default (none), and a
    # task that finds its value already set skips the round trip.
    raw = connection.connection
    if getattr(raw, "_job_statement_timeout_ms", 0) == milliseconds:
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('statement_timeout', %s, false)", [f"{milliseconds}ms"])
    connection.connection._job_statement_timeout_ms = milliseconds  # type: ignore[union-attr]
