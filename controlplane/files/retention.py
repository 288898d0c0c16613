"""File expiry (beat, ``batches.files_expire`` in files/tasks.py): files past their ``expires_at`` are deleted
(row, then blob), except a file a layer above still reads (files/in_use.py: a non-terminal batch's input),
which goes on the first run after it is free.

Bounded per run, soonest expiry first, so a backlog never makes one long run; the next run goes on."""

from __future__ import annotations

import logging
from datetime import datetime

from controlplane.core.http.errors import Conflict
from controlplane.core.workers.deadlines import job_time_up
from controlplane.files.in_use import file_users
from controlplane.files.models import File
from controlplane.files.services import file_delete

logger = logging.getLogger(__name__)

# Expired files deleted per run (a row and a blob each); the rest wait for the next run.
FILES_PER_RUN = 500


def files_expire(*, now: datetime, limit: int = FILES_PER_RUN) -> list[str]:
    """Delete files whose ``expires_at`` has passed, soonest expiry first; returns their ids. Files in use are
    left out of the query, so they never take a run's places (file_delete refuses them too, should a batch
    start reading one meanwhile). A crash between a row and its blob leaves an orphan blob, which the storage
    collector removes."""
    expired = File.objects.filter(expires_at__lte=now)
    for user in file_users():
        expired = expired.exclude(id__in=user.files_in_use())
    deleted = []
    for file in expired.order_by("expires_at")[:limit]:
        if job_time_up():
            break  # the next run deletes the rest (core/workers/deadlines.py)
        try:
            file_delete(file=file)
        except Conflict:
            continue  # a batch started reading it since the query: it expires after that batch
        deleted.append(file.id)
    if deleted:
        logger.info("deleted %d expired files", len(deleted))
    return deleted
