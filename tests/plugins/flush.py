"""How the test databases are flushed after a transactional test (``django_db(transaction=True)``, ~290 of them):
Django's flush empties every table and then emits post_migrate, whose handlers put back the rows every database
has (content types, permissions, the console's roles). Both are made cheaper here, for test databases only:
production never flushes. tests/plugins/test_flush.py holds both to Django's own result."""

from __future__ import annotations

from typing import Any

# (database alias, database name) → the rows post_migrate made after the first flush: [(table, columns, rows)].
# Django's own post_migrate emitter, kept for tests/plugins/test_flush.py to compare with.
emit_post_migrate: Any = None
_AFTER_POST_MIGRATE: dict[tuple[str, str], list[tuple[str, list[str], list[tuple[Any, ...]]]]] = {}


def install() -> None:
    _flush_by_delete()
    _post_migrate_replayed()


def _flush_by_delete() -> None:
    """Django's flush is one TRUNCATE of all 44 tables on Postgres: a new file for every table and index, 389 ms
    and 207 ms of Postgres' CPU each here. DELETE empties the same tables in 5 ms and 4 ms: the flushed tables hold
    a test's few rows. Every foreign key Django creates on Postgres is DEFERRABLE INITIALLY DEFERRED and the flush
    runs in one transaction, so the order does not matter. A flush that resets sequences, or cascades to tables it
    was not given (``available_apps``), keeps Django's TRUNCATE."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush

    def sql_flush(
        self: DatabaseOperations, style: Any, tables: Any, *, reset_sequences: bool = False, allow_cascade: bool = False
    ) -> list[str]:
        if reset_sequences or allow_cascade:
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        return [f"{style.SQL_KEYWORD('DELETE FROM')} {style.SQL_FIELD(self.quote_name(table))};" for table in tables]

    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]


def _post_migrate_replayed() -> None:
    """post_migrate after a flush costs ~114 ms of the test process' CPU (each app's content types and
    permissions looked up and created, the roles synced) and makes the same rows every time, into tables the flush
    has just emptied. The first flush of a database runs it and keeps what it made; every later flush of that
    database inserts those rows again, ids included, in one transaction. Postgres only, as the DELETE flush."""
    from django.core.management.commands import flush

    global emit_post_migrate
    emit = emit_post_migrate = flush.emit_post_migrate_signal

    def emit_or_replay(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        from django.db import connections

        connection = connections[db]
        key = (db, connection.settings_dict["NAME"])
        if connection.vendor != "postgresql" or kwargs:
            emit(verbosity, interactive, db, **kwargs)
            return
        rows = _AFTER_POST_MIGRATE.get(key)
        if rows is None:
            emit(verbosity, interactive, db, **kwargs)
            _AFTER_POST_MIGRATE[key] = _rows_of_every_table(connection)
        else:
            _rows_insert(connection, rows)

    flush.emit_post_migrate_signal = emit_or_replay


def _rows_of_every_table(connection: Any) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    """Every row of the flushed tables: right after a flush, all of it is post_migrate's."""
    found = []
    with connection.cursor() as cursor:
        for table in sorted(connection.introspection.django_table_names(only_existing=True, include_views=False)):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            rows = cursor.fetchall()
            if rows:
                found.append((table, [column.name for column in cursor.description], rows))
    return found


def _rows_insert(connection: Any, tables: list[tuple[str, list[str], list[tuple[Any, ...]]]]) -> None:
    from django.contrib.contenttypes.models import ContentType
    from django.db import transaction

    quote = connection.ops.quote_name
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        for table, columns, rows in tables:
            values = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
            names = ", ".join(quote(column) for column in columns)
            cursor.execute(
                f"INSERT INTO {quote(table)} ({names}) VALUES {values}", [value for row in rows for value in row]
            )
    # What create_contenttypes does after making them; the ids are the same, but a test may have cached others.
    ContentType.objects.clear_cache()
