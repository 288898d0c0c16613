"""Results while a batch runs (reads only): ``GET /v1/batches/{id}/output`` and ``…/errors``.

A stream is always a prefix of the result file finalization will write, byte for byte: the lines of the
shards, in index order, that can no longer change — ``succeeded``, ``stopped`` and ``skipped`` shards, read
with finalization's own ``shard_entries``, or for a succeeded shard its part's payloads of the stream's kind
in bulk (the same bytes: that is all ``shard_entries`` yields for it) — up to the first shard that is still
open (pending, running, or ``dead``, which an operator may requeue). Once the batch has ended, the stream is the result file itself,
read from the file's seek point at or before the cursor (File.line_offsets, written by finalization), not from its
first byte.
The cursor is therefore a plain position, the number of lines of the stream a client already holds: it
means the same while the batch runs and after, survives a dropped connection (the client counts the lines
it kept), and two readers see the same lines in the same order. The price of a prefix: a shard that stays
open holds back the lines after it until it closes (with many slots, shards close roughly in index order).

Only committed parts are read: ``part_name`` is set by ``shards.shard_commit`` alone, in the same UPDATE
that closes the shard, so a running or stale attempt's part is never named by a row read here. A validating
batch streams nothing (its early shards stay unseen until the file proves valid, as in its Batch object).

A closed shard's complete lines of one kind are kept in the web process after their first read
(results/part_cache.py), keyed by the batch, shard, part, status and kind they were rendered from: a follower
polling from behind, or many readers of one batch, do not read and render the same parts again. The cache is
per process and bounded (RESULTS_PART_CACHE_BYTES, least recently used out first) because it only saves work:
a miss renders the same bytes from storage, so a kept entry can never make a stream differ from the file.

One case breaks the prefix: a committed part that storage loses. Its lines are streamed while it is there (or
kept), and become ``part_lost`` errors in the files; a follower may then hold output lines the final file lacks.
A rendering that found its part lost is never kept: the next read asks storage again."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.render import public_status
from controlplane.batches.results.finalize import shard_entries
from controlplane.batches.results.part_cache import PartKey, part_entry_limit, part_lines_get, part_lines_put
from controlplane.batches.run.parts import part_payloads
from controlplane.core.http.errors import Conflict, ValidationFailed
from controlplane.files.selectors import file_line_seek
from controlplane.files.storage import READ_CHUNK_BYTES, blob_open, blob_read_range

# The streams, by URL name, and the part entries each carries (parts.py).
STREAM_ENTRY_KINDS = {"output": "out", "errors": "err"}
# Closed for good: their lines in the result files are known. A dead shard is closed too, but a requeue may
# still run it; its lines are known only once the batch finalizes.
FINAL_SHARD_STATUSES = (ShardStatus.SUCCEEDED, ShardStatus.STOPPED, ShardStatus.SKIPPED)
# Lines rendered one by one (stopped and skipped shards) go out in runs of this many.
_RUN_LINES = 1024
ENDED_STATUSES = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
# What rendering a closed shard's lines reads of its row (finalize.shard_entries).
_SHARD_FIELDS = ("id", "batch_id", "index", "status", "start_line", "end_line", "start_byte", "end_byte", "part_name")


@dataclass(frozen=True)
class ResultsSlice:
    """The lines after a cursor that are final now, as chunks of whole lines, and where they end."""

    chunks: Iterable[bytes]
    next_cursor: int
    complete: bool  # the batch has ended and nothing follows next_cursor
    status: str  # the batch's public status when the slice was taken
    # The result file's blob when the slice is all of it (an ended batch, cursor 0): the view may hand it to the
    # reverse proxy instead of sending it from a web thread.
    whole_file: str | None = None


def batch_results_slice(*, batch: Batch, stream: str, after: int) -> ResultsSlice:
    """The ``stream`` ("output" or "errors") lines of ``batch`` after the first ``after``; a cursor past
    what the batch can ever hold is a 400 (it was never given out)."""
    if batch.status in ENDED_STATUSES:
        return _ended_slice(batch, stream, after)
    if batch.status == BatchStatus.VALIDATING:
        _check_cursor(after, 0)
        return ResultsSlice(chunks=(), next_cursor=0, complete=False, status=public_status(batch))
    return _live_slice(batch, stream, after)


def _check_cursor(after: int, limit: int) -> None:
    if after > limit:
        raise ValidationFailed(
            f"The cursor {after} is past the end of this stream ({limit} lines at most): pass the X-Next-Cursor "
            "of an earlier response, or the number of lines you hold.",
            param="after",
            code="invalid_cursor",
        )


def _ended_slice(batch: Batch, stream: str, after: int) -> ResultsSlice:
    file_id = batch.output_file_id if stream == "output" else batch.error_file_id
    total = (batch.completed_lines if stream == "output" else batch.failed_lines) if file_id else 0
    _check_cursor(after, total)
    done = public_status(batch)
    if not file_id or after == total:
        return ResultsSlice(chunks=(), next_cursor=total, complete=True, status=done)
    seek = file_line_seek(tenant_id=batch.tenant_id, file_id=file_id, line=after)
    if seek is None:
        raise Conflict(
            f"The batch's {stream} file {file_id} was deleted or has expired: its lines can no longer be streamed.",
            param="batch_id",
            code="results_file_deleted",
        )
    chunks = _file_chunks(seek.storage_name, seek.skip_lines, start=seek.start_byte)
    whole = seek.storage_name if after == 0 else None
    return ResultsSlice(chunks=chunks, next_cursor=total, complete=True, status=done, whole_file=whole)


def _file_chunks(storage_name: str, skip_lines: int, *, start: int = 0) -> Iterator[bytes]:
    """The blob's bytes from ``start`` (a line's first byte) after ``skip_lines`` more lines, in storage-sized
    chunks (newlines counted in C)."""
    with blob_read_range(storage_name, start) as blob:
        while chunk := blob.read(READ_CHUNK_BYTES):
            if skip_lines:
                newlines = chunk.count(b"\n")
                if newlines < skip_lines:
                    skip_lines -= newlines
                    continue
                end = -1
                for _ in range(skip_lines):
                    end = chunk.index(b"\n", end + 1)
                chunk, skip_lines = chunk[end + 1 :], 0
            if chunk:
                yield chunk


def _live_slice(batch: Batch, stream: str, after: int) -> ResultsSlice:
    # Only the counts of every shard (tuples, not model rows: a 1M-line batch has hundreds of shards and a
    # follower asks every second); whole rows only for the shards this response streams.
    tallies = (
        Shard.objects.filter(batch_id=batch.id)
        .order_by("index")
        .values_list("id", "status", "request_count", "completed_lines")
    )
    _check_cursor(after, batch.total_lines)  # set before the batch left validating, never changed since
    plan: dict[int, int] = {}  # shard id → lines of it to skip
    position = 0
    for shard_id, status, request_count, completed_lines in tallies:
        if status not in FINAL_SHARD_STATUSES:
            break
        lines = completed_lines if stream == "output" else request_count - completed_lines
        if position + lines > after:
            plan[shard_id] = max(0, after - position)
        position += lines
    shards = list(Shard.objects.filter(id__in=plan).order_by("index").only(*_SHARD_FIELDS)) if plan else []
    if any(shard.status != ShardStatus.SUCCEEDED for shard in shards):
        # Read after the shards: a stop's reason is committed with its skipped shards, so this copy knows the
        # reason of every stopped or skipped shard above (their missing lines are written with it).
        batch.refresh_from_db(fields=["status", "stop_reason"])
    return ResultsSlice(
        chunks=_part_chunks(batch, [(shard, plan[shard.id]) for shard in shards], STREAM_ENTRY_KINDS[stream]),
        next_cursor=max(position, after),
        complete=False,
        status=public_status(batch),
    )


def _part_chunks(batch: Batch, plan: list[tuple[Shard, int]], entry_kind: str) -> Iterator[bytes]:
    lost: list[int] = []  # a part storage lost is reported by finalization; here its lines are just absent
    for shard, skip in plan:
        key = PartKey(batch.id, shard.id, shard.part_name or "", shard.status, entry_kind)
        kept = part_lines_get(key)
        if kept is not None:
            if skip:
                kept = kept[_after_lines(kept, skip) :]
            if kept:
                yield kept
            continue
        lost_before = len(lost)
        limit = part_entry_limit()
        record: list[bytes] | None = [] if limit else None  # the shard's lines so far, while small enough to keep
        recorded = 0
        for lines in _shard_lines(batch, shard, entry_kind, lost):
            if not lines:
                continue
            chunk = b"".join(lines)
            if record is not None:
                record.append(chunk)
                recorded += len(chunk)
                if recorded > limit:
                    record = None  # too large to keep: read from storage every time
            if skip:
                skipped = min(skip, len(lines))
                chunk, skip = b"".join(lines[skipped:]), skip - skipped
            if chunk:
                yield chunk
        # Reached only once the shard was rendered to its end (a client that left closes this generator first).
        if record is not None and len(lost) == lost_before:
            part_lines_put(key, b"".join(record))


def _after_lines(data: bytes, count: int) -> int:
    """The offset of the byte after the ``count``-th newline of ``data`` (it holds at least that many lines)."""
    end = -1
    for _ in range(count):
        end = data.index(b"\n", end + 1)
    return end + 1


def _shard_lines(batch: Batch, shard: Shard, entry_kind: str, lost: list[int]) -> Iterator[list[bytes]]:
    """A closed shard's lines of one kind (``out`` or ``err``), as ``shard_entries`` makes them for the result
    files, in runs of lines. A succeeded shard's are its part's entries of that kind and nothing else: they are
    found a storage chunk of whole lines at a time, not decoded one by one."""
    part = None
    if shard.status == ShardStatus.SUCCEEDED and shard.part_name:
        with contextlib.suppress(FileNotFoundError):  # storage lost it: shard_entries reports its lines lost
            part = blob_open(shard.part_name)
    if part is None:
        run: list[bytes] = []
        for _, kind, payload in shard_entries(batch, shard, lost):
            if kind == entry_kind:
                run.append(payload)
                if len(run) == _RUN_LINES:
                    yield run
                    run = []
        yield run
        return
    with part:
        rest = b""
        while chunk := part.read(READ_CHUNK_BYTES):
            text = rest + chunk
            cut = text.rfind(b"\n") + 1
            yield part_payloads(text[:cut], entry_kind)
            rest = text[cut:]
        yield part_payloads(rest, entry_kind)
