"""Running a service beside rows another transaction holds, for the tests of guards that rest on Postgres row
locks (``SELECT … FOR UPDATE SKIP LOCKED``). Mark such tests ``@pytest.mark.row_locks``:
tests/plugins/database.py refuses to run them on SQLite, which has no row locks, and says so."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import psycopg
from django.db import connection

T = TypeVar("T")

# How long the call may take before the test gives up on it, on a loaded 2-core machine; a call that waits on
# the held rows is caught sooner, by Postgres reporting it waiting on a lock.
GIVE_UP_SECONDS = 30.0


def connect(**options: object) -> psycopg.Connection:
    """A connection of its own to the test database (the holder of the rows, or the observer)."""
    db = connection.settings_dict
    return psycopg.connect(host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"], **options)  # type: ignore[call-overload]


def beside_held_rows(table: str, ids: Sequence[int], call: Callable[[], T]) -> tuple[T, float]:
    """Run ``call`` in a worker thread while another transaction holds these rows of ``table`` FOR UPDATE.
    Fails as soon as Postgres shows the call waiting for a lock; else returns its result and how long it took."""
    holder, observer = connect(), connect(autocommit=True)
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    try:
        holder.execute(f"SELECT id FROM {table} WHERE id = ANY(%s) FOR UPDATE", (list(ids),))
        started = time.monotonic()
        thread.start()
        waiting = 0
        while thread.is_alive() and not waiting and time.monotonic() - started < GIVE_UP_SECONDS:
            thread.join(0.01)
            waiting = observer.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()[0]
        took = time.monotonic() - started
        assert not waiting, f"the call waited for a {table} row another transaction holds"
        assert not thread.is_alive(), f"the call did not return within {GIVE_UP_SECONDS} s"
    finally:
        holder.rollback()  # lets a call that waited go on, so the thread ends
        thread.join(GIVE_UP_SECONDS)
        holder.close()
        observer.close()
    assert not errors, errors
    return result[0], took
