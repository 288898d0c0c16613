"""Database connections in workers: tidied around each task as Django tidies them around each request, and
riding out a database restart (run one small unit of work again until Postgres answers, for a while)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from django.db import DatabaseError, close_old_connections, connection

T = TypeVar("T")


def connections_tidy(**_: object) -> None:
    """task_prerun and task_postrun (controlplane/celery.py): what Django does on request_started and
    request_finished. A connection past CONN_MAX_AGE, in error, or with autocommit left off is closed; the one
    kept is health-checked (a `SELECT 1`) before its next query, so a restarted Postgres costs no failed task."""
    close_old_connections()


def when_database_answers(fn: Callable[[], T], *, within_s: float, pause_s: float = 0.5) -> T:
    """Call ``fn`` until it runs without a DatabaseError, on a fresh connection each time; after
    ``within_s`` the last error is raised. Only for work that is safe to repeat (a conditional UPDATE,
    a delete) and outside any transaction: a restart drops the connection, and ``fn`` must start over."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return fn()
        except DatabaseError:
            connection.close()  # the next try connects again
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause_s)
