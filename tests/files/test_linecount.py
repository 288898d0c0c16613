"""Uploads record their non-blank line count while the blob is stored, reading the file once."""

from __future__ import annotations

import io
import itertools

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from hypothesis import given
from hypothesis import strategies as st

from controlplane.files.linecount import LineCountingReader, NonBlankLineCounter
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from tests.support.batches import embedding_line, jsonl, upload


def _reference(content: bytes) -> int:
    return sum(1 for line in content.split(b"\n") if line.strip())


def _count_in_chunks(content: bytes, cuts: list[int]) -> int:
    counter = NonBlankLineCounter()
    bounds = [0, *sorted(cuts), len(content)]
    for start, end in itertools.pairwise(bounds):
        counter.feed(content[start:end])
    return counter.count


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", 0),
        (b"\n\n\n", 0),
        (b"  \t\n\r\n \n", 0),  # whitespace-only lines, CRLF included, are blank
        (b'{"a": 1}\n', 1),
        (b'{"a": 1}', 1),  # a last line without newline counts
        (b'{"a": 1}\r\n{"b": 2}\r\n', 2),
        (b'{"a": 1}\n\n   \n{"b": 2}\n  {"c": 3}  ', 3),
        (b"x\n \n", 1),
    ],
)
def test_counts_non_blank_lines_at_every_chunk_boundary(content, expected):
    assert _reference(content) == expected
    # One chunk, one cut at every position (inside a line, right after or before a newline, inside a
    # blank line), and one byte at a time.
    assert _count_in_chunks(content, []) == expected
    for cut in range(len(content) + 1):
        assert _count_in_chunks(content, [cut]) == expected, cut
    assert _count_in_chunks(content, list(range(len(content)))) == expected


def test_empty_chunks_change_nothing():
    counter = NonBlankLineCounter()
    for piece in (b"", b"a", b"", b"\n", b"", b" ", b""):
        counter.feed(piece)
    assert counter.count == 1


@given(
    content=st.lists(st.sampled_from([b"a", b"{}", b" ", b"\t", b"\r", b"\n", b"\n\n", b"\x0b"]), max_size=60).map(
        b"".join
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_any_chunking_counts_like_splitting_the_whole_file(content, cuts):
    assert _count_in_chunks(content, [c for c in cuts if c <= len(content)]) == _reference(content)


def test_reader_counts_each_byte_once_when_storage_reads_again():
    content = b"a\nb\n\nc"
    reader = LineCountingReader(io.BytesIO(content), size=len(content))
    assert reader.read(3) == b"a\nb"
    reader.seek(0)  # a retry from the start, as Django's chunks() and S3 part retries do
    assert reader.read() == content
    assert reader.read(10) == b""
    assert reader.line_count == 3


def test_reader_reports_no_count_unless_every_byte_was_read_in_order():
    content = b"a\nb\nc\n"
    partial = LineCountingReader(io.BytesIO(content), size=len(content))
    partial.read(2)
    assert partial.line_count is None
    skipping = LineCountingReader(io.BytesIO(content), size=len(content))
    skipping.seek(2)
    skipping.read()
    assert skipping.line_count is None
    whole = LineCountingReader(io.BytesIO(content), size=len(content))
    assert whole.read(None) == content and whole.line_count == 3


@pytest.mark.django_db
def test_file_create_records_the_line_count_and_stores_the_bytes_unchanged(tenant):
    content = jsonl([embedding_line(f"r{i}", "x") for i in range(3)]) + b"\n  \n" + b'{"last": true}'
    file = upload(tenant, content)
    assert File.objects.get(id=file.id).line_count == 4
    with blob_open(file.storage_name) as stream:
        assert stream.read() == content


@pytest.mark.django_db
@pytest.mark.parametrize("memory_limit", [10 * 1024 * 1024, 1024], ids=["in-memory", "temporary-file"])
def test_uploads_through_the_api_record_lines_across_storage_chunks(api, settings, memory_limit):
    """Larger than Django's 64 KiB storage chunk, with lines crossing chunk boundaries; small uploads are
    kept in memory, larger ones in a temporary file that storage must still read (not move)."""
    settings.FILE_UPLOAD_MAX_MEMORY_SIZE = memory_limit
    lines = [embedding_line(f"request-{i}", "word " * (i % 97)) for i in range(1500)]
    content = jsonl(lines).replace(b"\n", b"\n \n", 100)  # some blank lines too
    assert len(content) > 3 * 64 * 1024
    response = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"}, format="multipart"
    )
    assert response.status_code == 200, response.content
    file = File.objects.get(id=response.json()["id"])
    assert file.line_count == 1500 and file.bytes == len(content)
    with blob_open(file.storage_name) as stream:
        assert stream.read() == content
