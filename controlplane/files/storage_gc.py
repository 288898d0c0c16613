"""The orphan collector (beat, ``batches.storage_collect``): blobs that no row names, past a grace period.

The service writes blobs under a few prefixes only, and a row names each one it keeps:

    files/<tenant id>/<file id>                          uploads              File.storage_name
    results/<tenant id>/<batch id>_<kind>_<hex>.jsonl    output, error files  File.storage_name
    parts/<batch id>/<index>.attempt<n>.jsonl            shard parts          Shard.part_name
    parts/<batch id>/<index>.columns<n>.bin              shard columns        Shard.columns_name

Files owns the first two (files/services.py); a layer above registers the prefixes of its own blobs and says
which of them its rows name (files/in_use.py: the batch pipeline, for ``parts/``). On local storage a writer's
``<name>.<hex>.spool`` sits beside the blob while a part or result is written (no row names one: a crashed
writer's is an orphan like any other). Anything else in storage is not ours and is never touched. A blob is
written before the row that names it is committed (a crash in between leaves an orphan, never a row without its
blob), so a blob no row names is deleted only once it is older than STORAGE_GC_GRACE_SECONDS: longer than any
write-to-commit gap. Rows are asked right before each delete, so a blob a row names is never deleted. Works on
any Django storage with ``listdir`` and ``get_modified_time`` (local and S3)."""

from __future__ import annotations

import logging
import random
from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.storage import FileSystemStorage, Storage

from controlplane.core.workers.deadlines import job_time_up
from controlplane.files.in_use import FileUser, file_users
from controlplane.files.models import File
from controlplane.files.storage import blob_delete, blob_storage

logger = logging.getLogger(__name__)

# The prefixes of File rows' blobs (uploads, results); the layers above add theirs (files/in_use.py).
FILE_PREFIXES = ("files", "results")
# Names per row lookup: one IN (...) query each.
_LOOKUP_CHUNK = 500


def orphans_collect(*, now: datetime, scan_limit: int | None = None, rng: random.Random | None = None) -> list[str]:
    """Delete blobs under our prefixes that no row names and that are older than the grace period; returns
    their names. Looks at ``scan_limit`` (STORAGE_GC_SCAN_LIMIT) names at most, starting at a random directory
    and a random name in it, so successive runs cover all of storage however large it is. On local storage,
    an empty directory under a registered prefix is removed too once its owner no longer writes into it (S3
    has no directories)."""
    budget = settings.STORAGE_GC_SCAN_LIMIT if scan_limit is None else scan_limit
    rng = rng or random.Random()
    cutoff = now - timedelta(seconds=settings.STORAGE_GC_GRACE_SECONDS)
    storage = blob_storage()
    owners = {prefix: user for user in file_users() for prefix in user.blob_prefixes}
    prefixes = FILE_PREFIXES + tuple(prefix for prefix in owners if prefix not in FILE_PREFIXES)
    directories = [f"{prefix}/{name}" for prefix in prefixes for name in sorted(_listdir(storage, prefix)[0])]
    deleted: list[str] = []
    for directory in _rotated(directories, rng):
        if budget <= 0 or job_time_up():  # the next run goes on (core/workers/deadlines.py)
            break
        subdirectories, names = _listdir(storage, directory)
        if not names and not subdirectories:
            budget -= 1
            _remove_empty_directory(storage, directory, cutoff, owners.get(directory.split("/", 1)[0]))
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
    """The blobs among ``blobs`` that a File row or a registered user's row names. ``directory`` (the listing
    they all came from) lets a user narrow its lookup (a part directory to its batch's shards)."""
    named: set[str] = set()
    for start in range(0, len(blobs), _LOOKUP_CHUNK):
        chunk = blobs[start : start + _LOOKUP_CHUNK]
        named.update(File.objects.filter(storage_name__in=chunk).values_list("storage_name", flat=True))
        for user in file_users():
            named.update(user.blobs_named(chunk, directory=directory))
    return named


def _remove_empty_directory(storage: Storage, directory: str, cutoff: datetime, owner: FileUser | None) -> None:
    """Local storage keeps a directory after its blobs are gone (a batch's part directory); remove it once it
    has been empty past the grace period and its owner will not write into it again."""
    if not isinstance(storage, FileSystemStorage) or owner is None or owner.directory_in_use(directory):
        return
    if _modified_before(storage, directory, cutoff):
        try:
            storage.delete(directory)  # rmdir
        except OSError:  # a writer put a blob into it since the listing
            logger.info("directory %s is no longer empty; kept", directory)
