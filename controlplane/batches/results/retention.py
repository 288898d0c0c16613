"""The batch pipeline's data lifecycle sweeps (beat, batches/tasks.py). Files' own sweeps (expiry, orphan
blobs) are files/retention.py and files/storage_gc.py, which ask the pipeline what it still needs
(batches/results/file_use.py).

- ``history_prune``: the events and shard rows of batches that ended more than BATCH_RETENTION_DAYS ago;
  the Batch row itself, with its counts and file ids, stays.
- ``parts_collect``: the part and columns blobs of batches that ended more than STORAGE_GC_GRACE_SECONDS ago.

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

from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard
from controlplane.core.workers.deadlines import job_time_up
from controlplane.files.storage import blob_delete

logger = logging.getLogger(__name__)

# Rows per DELETE statement: small enough to be a short transaction, large enough to be few statements.
DELETE_CHUNK = 1000
# Rows of each kind one prune run deletes at most, so a run ends in seconds; the next run goes on.
PRUNE_ROWS_PER_RUN = 100_000
# Part blobs one run deletes at most; the rest go on the next run.
PARTS_PER_RUN = 5000

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


def parts_collect(*, now: datetime, limit: int = PARTS_PER_RUN) -> int:
    """Delete the part and columns blobs of batches that ended more than STORAGE_GC_GRACE_SECONDS ago
    (finalization has copied their lines into the output and error files); returns how many. The shard row
    forgets its blob first, then the blob goes: a crash in between leaves an orphan blob, which the orphan
    collector (files/storage_gc.py) removes later."""
    cutoff = now - timedelta(seconds=settings.STORAGE_GC_GRACE_SECONDS)
    ended = Shard.objects.filter(batch__in=Batch.objects.filter(ended_before(cutoff)))
    collected = 0
    for field in ("part_name", "columns_name"):
        named = ended.exclude(**{field: ""}).values_list("id", field)[: limit - collected]
        for shard_id, name in list(named):
            if job_time_up():
                break  # the next run collects the rest (core/workers/deadlines.py)
            # Conditional: only the run that clears the name deletes the blob.
            if Shard.objects.filter(id=shard_id, **{field: name}).update(**{field: ""}) == 1:
                blob_delete(name)
                collected += 1
    if collected:
        logger.info("deleted %d part blobs of ended batches", collected)
    return collected


def _delete_in_chunks(rows: QuerySet[BatchEvent] | QuerySet[Shard], *, limit: int) -> int:
    model: type[Model] = rows.model
    deleted = 0
    while deleted < limit and not job_time_up():
        ids = list(rows.values_list("id", flat=True)[: min(DELETE_CHUNK, limit - deleted)])
        if not ids:
            break
        # Nothing refers to these rows, so Django deletes them with one statement per chunk.
        count, _ = model._default_manager.filter(id__in=ids).delete()
        deleted += count
    return deleted
