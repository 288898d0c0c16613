"""Results while a batch runs (reads only): ``GET /v1/batches/{id}/output`` and ``…/errors``.

A stream is always a prefix of the result file finalization will write, byte for byte: the lines of the
shards, in index order, that can no longer change — ``succeeded``, ``stopped`` and ``skipped`` shards, read
with finalization's own ``shard_entries`` — up to the first shard that is still open (pending, running, or
``dead``, which an operator may requeue). Once the batch has ended, the stream is the result file itself.
The cursor is therefore a plain position, the number of lines of the stream a client already holds: it
means the same while the batch runs and after, survives a dropped connection (the client counts the lines
it kept), and two readers see the same lines in the same order. The price of a prefix: a shard that stays
open holds back the lines after it until it closes (with many slots, shards close roughly in index order).

Only committed parts are read: ``part_name`` is set by ``shards.shard_commit`` alone, in the same UPDATE
that closes the shard, so a running or stale attempt's part is never named by a row read here. A validating
batch streams nothing (its early shards stay unseen until the file proves valid, as in its Batch object).

One case breaks the prefix: a committed part that storage loses. Its lines are streamed while it is there,
and become ``part_lost`` errors in the files; a follower may then hold output lines the final file lacks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.render import public_status
from controlplane.batches.results.finalize import shard_entries
from controlplane.core.errors import Conflict, ValidationFailed
from controlplane.files.selectors import file_storage_name
from controlplane.files.storage import READ_CHUNK_BYTES, blob_open

# The streams, by URL name, and the part entries each carries (parts.py).
STREAM_ENTRY_KINDS = {"output": "out", "errors": "err"}
# Closed for good: their lines in the result files are known. A dead shard is closed too, but a requeue may
# still run it; its lines are known only once the batch finalizes.
FINAL_SHARD_STATUSES = (ShardStatus.SUCCEEDED, ShardStatus.STOPPED, ShardStatus.SKIPPED)
ENDED_STATUSES = (BatchStatus.COMPLETED, BatchStatus.FAILED, BatchStatus.EXPIRED, BatchStatus.CANCELLED)
_SHARD_FIELDS = (
    *("id", "batch_id", "index", "status", "start_line", "end_line", "start_byte", "end_byte"),
    *("request_count", "completed_lines", "part_name"),
)


@dataclass(frozen=True)
class ResultsSlice:
    """The lines after a cursor that are final now, as chunks of whole lines, and where they end."""

    chunks: Iterable[bytes]
    next_cursor: int
    complete: bool  # the batch has ended and nothing follows next_cursor
    status: str  # the batch's public status when the slice was taken


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
    storage_name = file_storage_name(tenant_id=batch.tenant_id, file_id=file_id)
    if storage_name is None:
        raise Conflict(
            f"The batch's {stream} file {file_id} was deleted or has expired: its lines can no longer be streamed.",
            param="batch_id",
            code="results_file_deleted",
        )
    return ResultsSlice(chunks=_file_chunks(storage_name, after), next_cursor=total, complete=True, status=done)


def _file_chunks(storage_name: str, skip_lines: int) -> Iterator[bytes]:
    """The blob's bytes after its first ``skip_lines`` lines, in storage-sized chunks (newlines counted in C)."""
    with blob_open(storage_name) as blob:
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


def _stream_lines(shard: Shard, stream: str) -> int:
    """How many lines a final shard puts in the stream's file: its output lines, or every other line (its
    part's error lines and, for a stopped or skipped shard, the lines it never ran)."""
    return shard.completed_lines if stream == "output" else shard.request_count - shard.completed_lines


def _live_slice(batch: Batch, stream: str, after: int) -> ResultsSlice:
    shards = list(Shard.objects.filter(batch_id=batch.id).order_by("index").only(*_SHARD_FIELDS))
    # Read after the shards: a stop's reason is committed with its skipped shards, so this copy knows the reason
    # of every stopped or skipped shard above (their missing lines are written with it).
    batch.refresh_from_db(fields=["status", "stop_reason", "total_lines"])
    _check_cursor(after, batch.total_lines)
    plan: list[tuple[Shard, int]] = []  # (shard, lines of it to skip)
    position = 0
    for shard in shards:
        if shard.status not in FINAL_SHARD_STATUSES:
            break
        lines = _stream_lines(shard, stream)
        if position + lines > after:
            plan.append((shard, max(0, after - position)))
        position += lines
    return ResultsSlice(
        chunks=_part_chunks(batch, plan, STREAM_ENTRY_KINDS[stream]),
        next_cursor=max(position, after),
        complete=False,
        status=public_status(batch),
    )


def _part_chunks(batch: Batch, plan: list[tuple[Shard, int]], entry_kind: str) -> Iterator[bytes]:
    lost: list[int] = []  # a part storage lost is reported by finalization; here its lines are just absent
    buffer: list[bytes] = []
    size = 0
    for shard, skip in plan:
        for _, kind, payload in shard_entries(batch, shard, lost):
            if kind != entry_kind:
                continue
            if skip:
                skip -= 1
                continue
            buffer.append(payload)
            size += len(payload)
            if size >= READ_CHUNK_BYTES:
                yield b"".join(buffer)
                buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)
