"""Database connections on the running stack: workers keep theirs across tasks, as the web keeps its across
requests. Celery's Django fixup closed every connection around every task, so each beat tick (~4 a second
here) and each shard opened a new one: a Postgres backend forked and torn down each time
(settings.CELERY_DB_REUSE_MAX, core/database.py)."""

from __future__ import annotations

import time

import pytest

from tests.e2e.helpers import embedding_lines, submit

pytestmark = pytest.mark.e2e

# The interval watched: beat sends ~4 housekeeping jobs a second with this stack's settings (rescue and expiry
# every 1 s, the outbox every 1 s, top-ups and webhooks every 2 s), ~40 tasks in 10 s besides the batch's own.
WATCH_S = 10.0


def _sessions(e2e) -> int:
    [(sessions,)] = e2e.sql("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
    return int(sessions)


def test_workers_reuse_their_database_connections_across_tasks(e2e):
    client = e2e.sdk()
    before = _sessions(e2e)
    started = time.monotonic()
    batch = e2e.wait_status(client, submit(client, embedding_lines(48, seed=3, prefix="c")).id, {"completed"})
    time.sleep(max(0.0, WATCH_S - (time.monotonic() - started)))
    # Postgres counts a session when it starts; the statistics reach the view within a second or so.
    time.sleep(1.5)
    opened = _sessions(e2e) - before
    # What may open one: this test's own two queries, a worker thread's first task, a connection past
    # CONN_MAX_AGE (60 s). One a task would be dozens.
    assert batch.request_counts.completed == 48
    assert opened <= 12, f"{opened} database sessions opened in ~{WATCH_S:g} s of housekeeping and one batch"
