"""Fixed-window counters (a key's requests per window): one row per (key, window start) in a model of the
caller's, counted up in one statement."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Field, Model


def window_increment(model: type[Model], *, key_field: str, key: int | str, window_start: datetime) -> int:
    """Add one to ``key``'s count for the window and return the new count, in one statement.

    The ORM has no increment-on-conflict (``bulk_create(update_conflicts=True)`` can only copy the new
    row's values), and UPDATE-then-INSERT needs a retry when two processes insert the same window at once
    plus a second query to read the count back. ``INSERT … ON CONFLICT DO UPDATE … RETURNING`` is atomic
    and returns exactly this request's count, with the same syntax on Postgres and SQLite (3.35+).
    Call it in autocommit: inside a request-long transaction (ATOMIC_REQUESTS) the row lock would serialize all
    of a key's requests, and a failed request would take its count back. ``model`` has the fields
    ``key_field``, ``window_start`` and ``count``, unique together on the first two."""
    key_f, start_f, count_f = (_field(model, name) for name in (key_field, "window_start", "count"))
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    key_col, start_col, count_col = (quote(str(field.column)) for field in (key_f, start_f, count_f))
    # Converted as the ORM would (SQLite stores text), so ORM filters on window_start match these rows.
    start_value = start_f.get_db_prep_value(window_start, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} ({key_col}, {start_col}, {count_col}) VALUES (%s, %s, 1) "
            f"ON CONFLICT ({key_col}, {start_col}) DO UPDATE SET {count_col} = {table}.{count_col} + 1 "
            f"RETURNING {count_col}",
            [key, start_value],
        )
        row = cursor.fetchone()
    return int(row[0])


def _field(model: type[Model], name: str) -> Field:  # type: ignore[type-arg]
    field = model._meta.get_field(name)
    if not isinstance(field, Field):
        raise TypeError(f"{model.__name__}.{name} is not a column")
    return field
