"""Memory stays flat in the file's size: a 64 MiB input is uploaded, half of it read as one shard range and
all of it downloaded through the API, each under a bound far below the file's size, on local files and
on the S3 server (tests/files/conftest.py). tracemalloc counts every Python allocation of every thread
(s3transfer's upload threads included)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings

from controlplane.batches.intake.lines import iter_lines
from controlplane.files.services import file_create
from controlplane.files.storage import blob_read_range, blob_storage
from tests.files.conftest import S3_TEST_CHUNK_BYTES, S3_TEST_CONCURRENCY

pytestmark = pytest.mark.django_db

MiB = 1024 * 1024
FILE_BYTES = 64 * MiB  # big enough that holding it, or any sizeable part of it, breaks every bound below
READ_BOUND = 8 * MiB  # a read holds one 256 KiB buffer and one line; the rest is slack for the client stack
# An S3 upload holds up to (in-memory parts + the reading thread's part) × part size (settings/storage.py),
# one more part while the upload's line counter splits the part it was handed (files/linecount.py), and
# 1 MiB hashing buffers per request (checksum, signature). A local upload copies in 64 KiB chunks.
UPLOAD_BOUND = {"local": READ_BOUND, "s3": (S3_TEST_CONCURRENCY + 2) * S3_TEST_CHUNK_BYTES + 6 * MiB}


@contextmanager
def peak_memory() -> Iterator[Callable[[], int]]:
    tracemalloc.start()
    peak = 0
    try:
        yield lambda: peak
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


@pytest.fixture(scope="module")
def big_input(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("big") / "input.jsonl"
    padding = "word " * 190
    with path.open("wb") as out:
        written = number = 0
        while written < FILE_BYTES:
            line = (
                b'{"custom_id": "r%d", "method": "POST", "url": "/v1/embeddings", '
                b'"body": {"model": "all-MiniLM-L6-v2", "input": "%s"}}\n' % (number, padding.encode())
            )
            out.write(line)
            written += len(line)
            number += 1
    return path


def test_upload_range_read_and_download_keep_memory_flat(any_storage, tenant, api, big_input):
    backend = "local" if any_storage is None else "s3"
    size = big_input.stat().st_size
    # boto3 loads its S3 service model (~13 MiB, once per thread's session) on first use: not the file's.
    blob_storage().exists("warm-up")

    with big_input.open("rb") as source, peak_memory() as upload_peak:
        file = file_create(tenant=tenant, content=source, filename="big.jsonl", purpose="batch", size=size)
    assert file.line_count is not None and file.line_count > 60_000
    assert upload_peak() < UPLOAD_BOUND[backend], f"upload peak {upload_peak() / MiB:.1f} MiB"

    # A shard range of half the file, read line by line as execution does.
    start = _line_start_after(big_input, size // 4)
    end = _line_start_after(big_input, 3 * size // 4)
    lines = 0
    with peak_memory() as read_peak, blob_read_range(file.storage_name, start, end) as stream:
        for line in iter_lines(stream, max_line_bytes=settings.BATCH_MAX_LINE_BYTES, start_byte=start, end_byte=end):
            lines += 1
            assert line.data is not None and line.data.endswith(b"}}\n")
    assert lines > 30_000
    assert read_peak() < READ_BOUND, f"range read peak {read_peak() / MiB:.1f} MiB"

    received = 0
    with peak_memory() as download_peak:
        response = api.get(f"/v1/files/{file.id}/content")
        assert response.status_code == 200 and response["Content-Length"] == str(size)
        for chunk in response.streaming_content:
            received += len(chunk)
        response.close()
    assert received == size
    assert download_peak() < READ_BOUND, f"download peak {download_peak() / MiB:.1f} MiB"


def _line_start_after(path: Path, offset: int) -> int:
    """The offset of the first line that starts at or after ``offset`` (shards start on line boundaries)."""
    with path.open("rb") as handle:
        handle.seek(offset)
        handle.readline()
        return handle.tell()
