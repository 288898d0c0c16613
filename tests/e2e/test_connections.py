"""Database connections on the running stack: workers keep theirs across tasks, as the web keeps its across
requests. Celery's Django fixup closed every connection around every task, so each beat tick (~4 a second
here) and each shard opened a new one: a Postgres backend forked and torn down each time
(settings.CELERY_DB_REUSE_MAX, core/workers/database.py)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e

# Beat sends ~4 housekeeping jobs a second with this stack's settings (rescue, expiry and the outbox every 1 s,
# top-ups and webhooks every 2 s): ~20 tasks in the 5 s watched, each a new session when connections were not kept.
WATCH_S = 5.0
# Long enough for beat to have sent a job to each thread of the control and webhooks workers (2 and 4): a thread's
# first task opens its connection, which is what a fresh stack (this module alone) would otherwise count.
WARM_S = 3.0


def _sessions(e2e) -> int:
    [(sessions,)] = e2e.sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    return int(sessions)


def test_workers_keep_their_database_connections_across_tasks(e2e):
    time.sleep(WARM_S)
    before = _sessions(e2e)
    time.sleep(WATCH_S)
    # Postgres counts a session when it starts; the statistics reach the view within a second or so.
    time.sleep(1.5)
    opened = _sessions(e2e) - before
    # What may open one: this test's own queries, a thread's first task, a connection past CONN_MAX_AGE (60 s).
    assert opened <= 6, f"{opened} database sessions opened in {WATCH_S:g} s of housekeeping"
