"""Blob storage for tenant files, batch parts and results, through Django's storage API (local or S3).

Writes go through the storage's own ``save`` (on S3 a multipart upload in bounded chunks, see settings).
Reads never go through ``Storage.open``: django-storages' S3File downloads the whole object into memory
before it returns a byte, so every shard would fetch the entire input file. ``blob_read_range`` streams
instead: an HTTP Range GET on S3, a seek on local files, then reads in ``READ_CHUNK_BYTES`` pieces, so
a web or worker process holds one buffer per open blob whatever the file's size."""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings
from django.core.files import File as DjangoFile
from django.core.files.storage import FileSystemStorage, Storage, storages
from django.utils.http import content_disposition_header
from storages.backends.s3 import S3Storage
from storages.utils import clean_name

# One read from storage: large enough that a 1 GiB download is a few thousand reads, small enough that
# memory stays flat (the web process holds one such buffer per download in flight).
READ_CHUNK_BYTES = 256 * 1024


def blob_storage() -> Storage:
    return storages["default"]


def blob_save(name: str, content: IO[bytes]) -> str:
    """Save under exactly ``name``; callers choose unique names, so a clash is a bug we want to see."""
    storage = blob_storage()
    saved = storage.save(name, DjangoFile(content))
    if saved != name:
        storage.delete(saved)
        raise RuntimeError(f"blob {name!r} already exists")
    return saved


@contextlib.contextmanager
def blob_spool(name: str) -> Iterator[IO[bytes]]:
    """A scratch file for content that ``blob_save_spooled`` will store under ``name``. On local storage it
    is written beside that blob (``name`` + ".<hex>.spool", under the same prefix), so storing it is a link rather
    than a second copy of what may be a gigabyte, and a crash leaves it where the orphan collector finds it
    (files/storage_gc.py). On S3 it is a local temporary file that the upload reads."""
    storage = blob_storage()
    # A name of its own (never shared with another writer of the same blob name), created exclusively.
    local = isinstance(storage, FileSystemStorage)
    path = Path(storage.path(f"{name}.{secrets.token_hex(4)}.spool")) if local else None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    spool = open(path, "x+b") if path is not None else tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    try:
        yield spool
    finally:
        spool.close()
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


def blob_save_spooled(name: str, spool: IO[bytes]) -> str:
    """Store a ``blob_spool(name)`` file under ``name`` (which must not exist yet, as for blob_save)."""
    spool.flush()
    storage = blob_storage()
    spooled = Path(str(getattr(spool, "name", "")))
    target = Path(storage.path(name)) if isinstance(storage, FileSystemStorage) else None
    if target is not None and spooled.parent == target.parent and spooled.name.startswith(f"{target.name}."):
        os.link(spooled, target)  # FileExistsError on a clash: a bug we want to see
        return name
    spool.seek(0)
    return blob_save(name, spool)


def blob_delete(name: str) -> None:
    blob_storage().delete(name)


class _RangeSource(io.RawIOBase):
    """The bytes of one blob's range, read forward once from an open source (file or HTTP body)."""

    def __init__(self, read: Callable[[int], bytes], release: Callable[[], None], length: int):
        super().__init__()
        self._read = read
        self._release = release
        self.length = length
        self._left = length

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), self._left)
        if want <= 0:
            return 0
        try:
            data = self._read(want)
        except BotoCoreError as exc:  # a dropped or timed-out S3 stream: storage I/O, like a local OSError
            raise OSError(f"reading from storage failed: {exc}") from exc
        buffer[: len(data)] = data
        self._left -= len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._release()
        super().close()


class BlobReader(io.BufferedReader):
    """A forward-only binary stream over a blob's byte range (``read``, ``readline``, iteration by
    line). ``length`` is the number of bytes it yields in all, for a Content-Length."""

    def __init__(self, source: _RangeSource):
        super().__init__(source, buffer_size=READ_CHUNK_BYTES)
        self.length = source.length


def blob_read_range(name: str, start: int = 0, end: int | None = None) -> BlobReader:
    """Stream bytes ``[start, end)`` of a blob (``end=None``: to its end). Only that range is fetched.
    Raises FileNotFoundError when the blob is gone and OSError for other storage failures, so callers
    can tell a lost blob from an outage."""
    if end is not None and end <= start:
        return BlobReader(_RangeSource(lambda size: b"", lambda: None, 0))
    storage = blob_storage()
    if isinstance(storage, S3Storage):
        return BlobReader(_s3_range(storage, name, start, end))
    handle = storage.open(name, "rb")
    try:
        size = handle.size
        handle.seek(start)
    except BaseException:
        handle.close()
        raise
    length = max(0, (size if end is None else min(end, size)) - start)
    return BlobReader(_RangeSource(handle.read, handle.close, length))


def blob_open(name: str) -> BlobReader:
    """The whole blob, streamed."""
    return blob_read_range(name)


def blob_presigned_url(name: str, *, filename: str, content_type: str, seconds: int) -> str | None:
    """A URL that GETs the blob straight from S3 for ``seconds``, answered with the given download filename
    and content type; None when storage is not S3 (local files have no such URL)."""
    storage = blob_storage()
    if not isinstance(storage, S3Storage):
        return None
    key = storage._normalize_name(clean_name(name))
    params = {
        "Bucket": storage.bucket_name,
        "Key": key,
        "ResponseContentType": content_type,
        "ResponseContentDisposition": content_disposition_header(False, filename) or "inline",
    }
    # Signing is local (no request to S3): the storage's own client, credentials and endpoint.
    url = storage.connection.meta.client.generate_presigned_url("get_object", Params=params, ExpiresIn=seconds)
    return str(url)


def blob_accel_target(name: str) -> str | None:
    """Where the shipped nginx sends the blob from (its internal location, FILE_DOWNLOAD_ACCEL_PREFIX mapped onto
    the storage root) for an ``X-Accel-Redirect``; None when that is not configured or storage is not local files.
    Streamed from a web thread instead, a slow client's 1 GiB download holds a gunicorn thread for its whole
    length."""
    prefix = settings.FILE_DOWNLOAD_ACCEL_PREFIX
    if not prefix or not isinstance(blob_storage(), FileSystemStorage):
        return None
    return prefix.rstrip("/") + "/" + quote(name, safe="/")


def _s3_range(storage: S3Storage, name: str, start: int, end: int | None) -> _RangeSource:
    key = storage._normalize_name(clean_name(name))
    ranged = start > 0 or end is not None
    params = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if ranged else {}
    try:
        # The low-level client of the storage's own (thread-local) connection: same credentials and
        # endpoint as its writes, and a streaming body instead of S3File's download into memory.
        response = storage.connection.meta.client.get_object(Bucket=storage.bucket_name, Key=key, **params)
    except ClientError as exc:
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404:
            raise FileNotFoundError(f"blob {name!r} does not exist in bucket {storage.bucket_name!r}") from exc
        if status == 416:  # the range starts at or past the end of the object: nothing to read
            return _RangeSource(lambda size: b"", lambda: None, 0)
        raise OSError(f"storage GET {name!r} failed: {exc}") from exc
    except BotoCoreError as exc:  # endpoint unreachable, connection reset, timeout
        raise OSError(f"storage GET {name!r} failed: {exc}") from exc
    body = response["Body"]
    return _RangeSource(body.read, body.close, int(response["ContentLength"]))
