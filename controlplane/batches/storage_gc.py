"""The storage collector (beat, batches/tasks.py): part blobs of ended batches, and orphan blobs.

The service writes blobs under three prefixes only, and a row names each one it keeps:

    files/<tenant id>/<file id>                          uploads              File.storage_name
    results/<tenant id>/<batch id>_<kind>_<hex>.jsonl    output, error files  File.storage_name
    parts/<batch id>/<index>.attempt<n>.jsonl            shard parts          Shard.part_name
    parts/<batch id>/<index>.columns<n>.bin              shard columns        Shard.columns_name

(files/services.py, batches/results/finalize.py, batches/run/execution.py), plus, on local storage, a writer's
``<name>.<hex>.spool`` beside the blob while a part or result is written (no row names one: a crashed
writer's is an orphan like any other). Anything else in storage is not ours and
is never touched. A blob is written before the row that names it is committed (a crash in between leaves
an orphan, never a row without its blob), so a blob no row names is deleted only once it is older than
STORAGE_GC_GRACE_SECONDS: longer than any write-to-commit gap. Rows are asked right before each delete,
so a blob a row names is never deleted. Works on any Django storage with ``listdir`` and
``get_modified_time`` (local and S3)."""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage

from controlplane.batches.models import ACTIVE_STATUSES, Batch, Shard
from controlplane.batches.retention import ended_before
from controlplane.files.models import File
from controlplane.files.storage import blob_delete, blob_storage

logger = logging.getLogger(__name__)

PREFIXES = ("files", "results", "parts")
# Part blobs one run deletes at most; the rest go on the next run.
PARTS_PER_RUN = 5000
# Names per row lookup: one IN (...) query each.
_LOOKUP_CHUNK = 500


def parts_collect(*, now: datetime, limit: int = PARTS_PER_RUN) -> int:
    """Delete the part and columns blobs of batches that ended more than STORAGE_GC_GRACE_SECONDS ago
    (finalization has copied their lines into the output and error files); returns how many. The shard row
    forgets its blob first, then the blob goes: a crash in between leaves an orphan blob, collected later."""
    cutoff = now - timedelta(seconds=settings.STORAGE_GC_GRACE_SECONDS)
    ended = Shard.objects.filter(batch__in=Batch.objects.filter(ended_before(cutoff)))
    collected = 0
    for field in ("part_name", "columns_name"):
        named = ended.exclude(**{field: ""}).values_list("id", field)[: limit - collected]
        for shard_id, name in list(named):
            # Conditional: only the run that clears the name deletes the blob.
            if Shard.objects.filter(id=shard_id, **{field: name}).update(**{field: ""}) == 1:
                blob_delete(name)
                collected += 1
    if collected:
        logger.info("deleted %d part blobs of ended batches", collected)
    return collected


def orphans_collect(*, now: datetime, scan_limit: int | None = None, rng: random.Random | None = None) -> list[str]:
    """Delete blobs under our prefixes that no File or Shard row names and that are older than the
    grace period; returns their names. Looks at ``scan_limit`` (STORAGE_GC_SCAN_LIMIT) names at most,
    starting at a random directory and a random name in it, so successive runs cover all of storage
    however large it is. On local storage, an empty part directory of a batch that is not running is
    removed too (S3 has no directories)."""
    budget = settings.STORAGE_GC_SCAN_LIMIT if scan_limit is None else scan_limit
    rng = rng or random.Random()
    cutoff = now - timedelta(seconds=settings.STORAGE_GC_GRACE_SECONDS)
    storage = blob_storage()
    directories = [f"{prefix}/{name}" for prefix in PREFIXES for name in sorted(_listdir(storage, prefix)[0])]
    deleted: list[str] = []
    for directory in _rotated(directories, rng):
        if budget <= 0:
            break
        subdirectories, names = _listdir(storage, directory)
        if not names and not subdirectories:
            budget -= 1
            _remove_empty_part_directory(storage, directory, cutoff)
            continue
        names = _rotated(sorted(names), rng)[:budget]
        budget -= len(names)
        blobs = [f"{directory}/{name}" for name in names]
        named = _named(blobs, directory=directory)
        old = [blob for blob in blobs if blob not in named and _modified_before(storage, blob, cutoff)]
        # Asked again, of every table without the directory shortcut, right before deleting.
        for blob in sorted(set(old) - _named(old)):
            blob_delete(blob)
            deleted.append(blob)
    if deleted:
        logger.info("deleted %d orphan blobs: %s", len(deleted), ", ".join(deleted[:10]))
    return deleted


def _listdir(storage: Storage, path: str) -> tuple[list[str], list[str]]:
    try:
        directories, files = storage.listdir(path)
    except FileNotFoundError:  # local storage before anything was written under the prefix
        return [], []
    return list(directories), list(files)


def _modified_before(storage: Storage, name: str, cutoff: datetime) -> bool:
    try:
        return storage.get_modified_time(name) < cutoff
    except Exception:  # noqa: BLE001 - gone since the listing (local FileNotFoundError, an S3 404): skip it
        return False


def _rotated(items: list[str], rng: random.Random) -> list[str]:
    if not items:
        return items
    start = rng.randrange(len(items))
    return items[start:] + items[:start]


def _named(blobs: list[str], *, directory: str | None = None) -> set[str]:
    """The blobs among ``blobs`` that a File or Shard row names. With ``directory``, a part directory's
    lookup is narrowed to its batch's shards (indexed; Shard.part_name has no index of its own)."""
    named: set[str] = set()
    for start in range(0, len(blobs), _LOOKUP_CHUNK):
        chunk = blobs[start : start + _LOOKUP_CHUNK]
        named.update(File.objects.filter(storage_name__in=chunk).values_list("storage_name", flat=True))
        for field in ("part_name", "columns_name"):
            shards = Shard.objects.filter(**{f"{field}__in": chunk})
            if directory is not None and directory.startswith("parts/"):
                shards = shards.filter(batch_id=directory.removeprefix("parts/"))
            named.update(shards.values_list(field, flat=True))
    return named


def _remove_empty_part_directory(storage: Storage, directory: str, cutoff: datetime) -> None:
    """Local storage keeps a batch's part directory after its parts are gone; remove it once it has been
    empty past the grace period and its batch is not running (a new attempt would write into it)."""
    if not isinstance(storage, FileSystemStorage) or not directory.startswith("parts/"):
        return
    batch_id = directory.removeprefix("parts/")
    if Batch.objects.filter(id=batch_id, status__in=ACTIVE_STATUSES).exists():
        return
    if _modified_before(storage, directory, cutoff):
        try:
            storage.delete(directory)  # rmdir
        except OSError:  # an attempt wrote into it since the listing
            logger.info("part directory %s is no longer empty; kept", directory)
