"""Data lifecycle sweeps that need to know about batches (beat, batches/tasks.py).

- ``files_expire``: files past their ``expires_at`` are deleted (row, then blob), except an input file a
  non-terminal batch still reads, which goes on the first run after that batch ends.
- ``history_prune``: the events and shard rows of batches that ended more than BATCH_RETENTION_DAYS ago;
  the Batch row itself, with its counts and file ids, stays.

Both are bounded per run and delete in small chunks, each its own short transaction, so a backlog (the
first run on a year of history) never holds locks for long nor builds one huge transaction.
"""

from __future__ import annotations

import logging
import operator
from datetime import datetime, timedelta
from functools import reduce

from django.conf import settings
from django.db.models import Model, Q, QuerySet

from controlplane.batches.models import ACTIVE_STATUSES, Batch, BatchEvent, BatchStatus, Shard
from controlplane.core.errors import Conflict
from controlplane.files.models import File
from controlplane.files.services import file_delete

logger = logging.getLogger(__name__)

# Expired files deleted per run (a row and a blob each); the rest wait for the next run.
FILES_PER_RUN = 500
# Rows per DELETE statement: small enough to be a short transaction, large enough to be few statements.
DELETE_CHUNK = 1000
# Rows of each kind one prune run deletes at most, so a run ends in seconds; the next run goes on.
PRUNE_ROWS_PER_RUN = 100_000

# The stamp each terminal status sets when the batch ends.
_ENDED_AT = {
    BatchStatus.COMPLETED: "completed_at",
    BatchStatus.FAILED: "failed_at",
    BatchStatus.EXPIRED: "expired_at",
    BatchStatus.CANCELLED: "cancelled_at",
}


def ended_before(cutoff: datetime) -> Q:
    """Batches in a terminal state that they reached before ``cutoff``."""
    return reduce(operator.or_, (Q(status=status, **{f"{stamp}__lt": cutoff}) for status, stamp in _ENDED_AT.items()))


def files_expire(*, now: datetime, limit: int = FILES_PER_RUN) -> list[str]:
    """Delete files whose ``expires_at`` has passed, soonest expiry first; returns their ids. Input files
    of non-terminal batches are skipped (file_delete refuses them too, should one start meanwhile). A
    crash between a row and its blob leaves an orphan blob, which the storage collector removes."""
    in_use = Batch.objects.filter(status__in=ACTIVE_STATUSES).values("input_file_id")
    expired = File.objects.filter(expires_at__lte=now).exclude(id__in=in_use).order_by("expires_at")
    deleted = []
    for file in expired[:limit]:
        try:
            file_delete(file=file)
        except Conflict:
            continue  # a batch started reading it since the query: it expires after that batch
        deleted.append(file.id)
    if deleted:
        logger.info("deleted %d expired files", len(deleted))
    return deleted


def history_prune(*, now: datetime, limit: int = PRUNE_ROWS_PER_RUN) -> dict[str, int]:
    """Delete BatchEvent and Shard rows of batches that ended more than BATCH_RETENTION_DAYS before
    ``now``; returns how many of each. Part blobs a deleted shard still named are left to the storage
    collector (normally it deleted them long before: its grace is an hour, retention is days)."""
    old = Batch.objects.filter(ended_before(now - timedelta(days=settings.BATCH_RETENTION_DAYS)))
    pruned = {
        "events": _delete_in_chunks(BatchEvent.objects.filter(batch__in=old), limit=limit),
        "shards": _delete_in_chunks(Shard.objects.filter(batch__in=old), limit=limit),
    }
    if any(pruned.values()):
        logger.info("pruned history of ended batches: %s", pruned)
    return pruned


def _delete_in_chunks(rows: QuerySet[BatchEvent] | QuerySet[Shard], *, limit: int) -> int:
    model: type[Model] = rows.model
    deleted = 0
    while deleted < limit:
        ids = list(rows.values_list("id", flat=True)[: min(DELETE_CHUNK, limit - deleted)])
        if not ids:
            break
        # Nothing refers to these rows, so Django deletes them with one statement per chunk.
        count, _ = model._default_manager.filter(id__in=ids).delete()
        deleted += count
    return deleted
