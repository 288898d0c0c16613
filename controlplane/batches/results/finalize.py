"""Finalization: merge committed parts, in input order, into the batch's output and error files.

Lines no part holds (a shard skipped by cancel/expiry, stopped midway, or dead after all its attempts)
become error lines, so every custom_id appears exactly once across the two files. So do the lines of a
committed part that storage lost (``part_lost``): finalization never waits for a blob that is gone."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import IO

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.batches.intake.lines import iter_lines
from controlplane.batches.models import SHARD_OPEN_STATUSES, Batch, BatchStatus, Shard, ShardStatus, StopReason
from controlplane.batches.run.parts import decode_entry, dumps
from controlplane.batches.run.records import error_record
from controlplane.batches.selectors import batch_input_name
from controlplane.batches.transitions import FINALIZABLE, batch_finalizing, batch_finish, event_record
from controlplane.core.messaging import dispatch
from controlplane.core.observability import tracing
from controlplane.core.workers.deadlines import job_time_up
from controlplane.files.services import LINE_INDEX_STEP_BYTES, file_result_create, result_blob_name
from controlplane.files.storage import blob_delete, blob_open, blob_read_range, blob_save_spooled, blob_spool

logger = logging.getLogger(__name__)

KINDS = ("output", "error")

_MISSING_LINE_ERRORS = {
    StopReason.CANCEL: ("batch_cancelled", "The batch was cancelled before this request ran."),
    StopReason.EXPIRE: ("batch_expired", "This request could not be executed before the completion window expired."),
    None: ("internal_error", "This request could not be processed after repeated attempts."),
}
_PART_LOST_ERROR = ("part_lost", "The results of this request were lost in storage; re-run it.")
# A spend cap's lines carry the message the stop wrote on the batch (it names the cap and the amount spent).
SPEND_CAP_ERROR_CODE = "spend_cap_exceeded"


def _missing_line_error(batch: Batch, shard: Shard) -> tuple[str, str]:
    reason = StopReason(batch.stop_reason) if batch.stop_reason and shard.status != ShardStatus.DEAD else None
    if reason == StopReason.SPEND_CAP:
        stated = (batch.errors or {}).get("data") or [{}]
        return SPEND_CAP_ERROR_CODE, stated[0].get("message") or "The tenant's monthly spend cap was reached."
    return _MISSING_LINE_ERRORS[reason]


def batch_try_finalize(*, batch_id: str) -> bool:
    """Move a batch whose shards are all closed into finalizing, then finalize. Safe to call often."""
    if not _finalizing_take(batch_id=batch_id):
        return False
    batch_finalize(batch_id=batch_id)
    return True


def _finalizing_take(*, batch_id: str) -> bool:
    """Move the batch into finalizing when its shards are all closed; True for the one caller that did."""
    if Shard.objects.filter(batch_id=batch_id, status__in=SHARD_OPEN_STATUSES).exists():
        return False  # the common case, answered without a lock
    with transaction.atomic():
        # shards.shard_requeue reopens a dead shard under this batch row lock: checking again under it
        # means a requeued shard is never left pending in a batch that finalized without it.
        if not list(Batch.objects.select_for_update().filter(id=batch_id, status__in=FINALIZABLE).values_list("id")):
            return False
        if Shard.objects.filter(batch_id=batch_id, status__in=SHARD_OPEN_STATUSES).exists():
            return False
        return batch_finalizing(batch_id=batch_id, now=timezone.now())


def batches_finalize_stuck() -> list[str]:
    """Restart finalizers that died (after FINALIZE_STALE_SECONDS), and finalize batches whose last shard
    closed unnoticed: in_progress or cancelling (a lost finalize message, a running shard of a cancelled
    batch closed as skipped by shards.shards_rescue when its worker died).

    The rescuer (a beat job) only takes each batch into (or back into) finalizing and sends it to the control
    queue: merging a large batch's parts is tenant work, which must not hold a housekeeping thread."""
    stale_before = timezone.now() - timedelta(seconds=settings.FINALIZE_STALE_SECONDS)
    stale = Batch.objects.filter(status=BatchStatus.FINALIZING, finalizing_at__lt=stale_before).values_list(
        "id", flat=True
    )
    done: list[str] = []
    for batch_id in list(stale):
        if job_time_up():
            return done  # the next run goes on (core/workers/deadlines.py)
        with transaction.atomic():
            if Batch.objects.filter(id=batch_id, status=BatchStatus.FINALIZING).update(finalizing_at=timezone.now()):
                dispatch.batch_finalize_enqueue(batch_id, taken=True)
                done.append(batch_id)
    idle = Batch.objects.filter(status__in=FINALIZABLE).exclude(shards__status__in=SHARD_OPEN_STATUSES)
    for batch_id in list(idle.values_list("id", flat=True)):
        if job_time_up():
            break
        with transaction.atomic():
            if _finalizing_take(batch_id=batch_id):
                dispatch.batch_finalize_enqueue(batch_id, taken=True)
                done.append(batch_id)
    return done


class FinalizeDeadlinePassed(Exception):
    """The finalizer lost its hold on the batch (the rescuer presumed it dead and restarted it); the batch stays
    finalizing for the restart."""


def finalize_stop_at(batch: Batch) -> float:
    """When (time.monotonic) a finalizer of ``batch`` must have renewed its hold (``_FinalizeLease``): a little
    before the rescuer presumes it dead (FINALIZE_STALE_SECONDS after ``finalizing_at``), so a restart never runs
    beside it; as validation's deadline, a tenth of it, at most 30 s, earlier."""
    stale = timedelta(seconds=settings.FINALIZE_STALE_SECONDS)
    since = batch.finalizing_at or timezone.now()
    stop = since + stale - min(stale * 0.1, timedelta(seconds=30))
    return time.monotonic() + (stop - timezone.now()).total_seconds()


class _FinalizeLease:
    """A finalizer's hold on its batch: ``finalizing_at`` as it took it, moved forward every quarter of
    FINALIZE_STALE_SECONDS while the merge goes on, so a batch whose results take longer than that to write is
    finished by one finalizer instead of restarted from its first part at every deadline, forever. The move is
    conditional on the value it took: once the rescuer has restarted the batch (a new ``finalizing_at``) the move
    finds no row and this finalizer stops, publishing nothing (Postgres orders the two UPDATEs on the row)."""

    def __init__(self, batch: Batch) -> None:
        self.batch_id, self.taken_at = batch.id, batch.finalizing_at
        self.stop_at = finalize_stop_at(batch)
        self.renew_at = min(self.stop_at, time.monotonic() + settings.FINALIZE_STALE_SECONDS / 4)

    def check(self) -> None:
        """Per line: a clock read, and a renewal when one is due; raises FinalizeDeadlinePassed when the hold
        is lost."""
        now = time.monotonic()
        if now < self.renew_at:
            return
        renewed = timezone.now()
        held = Batch.objects.filter(id=self.batch_id, status=BatchStatus.FINALIZING, finalizing_at=self.taken_at)
        if not held.update(finalizing_at=renewed):
            raise FinalizeDeadlinePassed()
        stale = settings.FINALIZE_STALE_SECONDS
        self.taken_at = renewed
        self.stop_at = now + stale - min(stale * 0.1, 30)
        self.renew_at = min(self.stop_at, now + stale / 4)


def _open_part(part_name: str) -> IO[bytes] | None:
    """The part, streamed, or None when storage no longer has it. Other storage errors propagate: a
    passing outage must not fail lines for good, and the stale-finalizer rescue runs finalization again."""
    try:
        return blob_open(part_name)
    except FileNotFoundError:  # deleted, or never reached storage
        logger.warning("part %s is lost; its lines become part_lost errors", part_name, exc_info=True)
        return None


def _part_entries(part: IO[bytes]) -> Iterator[tuple[int, str, bytes]]:
    last = 0
    for raw in part:
        if raw.strip():
            entry = decode_entry(raw)
            if entry[0] <= last:  # execution writes parts sorted; the merge below relies on it
                raise RuntimeError(f"part entries out of line order: {entry[0]} after {last}")
            last = entry[0]
            yield entry


def _with_missing_lines(
    batch: Batch, shard: Shard, entries: Iterator[tuple[int, str, bytes]], *, part_lost: bool = False
) -> Iterator[tuple[int, str, bytes]]:
    """The part's entries with an error line for every line of the shard that they lack, in input order.
    Both are in ascending line order, so one pass over each merges them, holding one line of each."""
    if part_lost:
        code, message = _PART_LOST_ERROR
    else:
        code, message = _missing_line_error(batch, shard)
    pending = next(entries, None)
    with blob_read_range(batch_input_name(batch), shard.start_byte, shard.end_byte) as stream:
        for line in iter_lines(
            stream,
            max_line_bytes=settings.BATCH_MAX_LINE_BYTES,
            start_byte=shard.start_byte,
            end_byte=shard.end_byte,
            first_line_number=shard.start_line,
        ):
            has_result = False
            while pending is not None and pending[0] <= line.number:
                has_result = has_result or pending[0] == line.number
                yield pending
                pending = next(entries, None)
            if has_result or line.is_blank or line.data is None:
                continue
            custom_id = json.loads(line.data)["custom_id"]
            record = error_record(batch.id, line.number, custom_id, code=code, message=message)
            yield line.number, "err", dumps(record) + b"\n"
    while pending is not None:
        yield pending
        pending = next(entries, None)


def shard_entries(batch: Batch, shard: Shard, lost_parts: list[int]) -> Iterator[tuple[int, str, bytes]]:
    """The shard's output and error lines in input order, streamed from its part and, for lines the part
    lacks, its byte range of the input. Also what results/live.py streams of a closed shard while the batch
    runs, so those lines are the result files' own bytes."""
    if not shard.part_name:
        if shard.status != ShardStatus.SUCCEEDED:
            yield from _with_missing_lines(batch, shard, iter(()))
        return
    part = _open_part(shard.part_name)
    if part is None:
        # Its results cannot come back: every line of the shard is reported as lost, once.
        lost_parts.append(shard.index)
        yield from _with_missing_lines(batch, shard, iter(()), part_lost=True)
        return
    with part:
        if shard.status == ShardStatus.SUCCEEDED:
            yield from _part_entries(part)
        else:
            yield from _with_missing_lines(batch, shard, _part_entries(part))


def batch_finalize(*, batch_id: str) -> None:
    batch = Batch.objects.get(id=batch_id)
    if batch.status != BatchStatus.FINALIZING:
        return
    # The last stage of the batch's trace (core/observability/tracing.py), wherever it runs: the slot or the control queue.
    with tracing.batch_span(
        "batch.finalize", traceparent=batch.trace_parent, attributes={"batch.id": batch_id}
    ) as span:
        try:
            completed, failed = _batch_finalize(batch, lease=_FinalizeLease(batch))
        except FinalizeDeadlinePassed:
            # Nothing was published (the spools are discarded); the rescuer's restart begins again from the parts.
            logger.warning("batch=%s finalize lost its hold on the batch (restarted)", batch_id)
            tracing.span_fail(span, "finalize lost its hold on the batch")
            return
        if span is not None:
            span.set_attributes({"batch.completed": completed, "batch.failed": failed})


def _batch_finalize(batch: Batch, *, lease: _FinalizeLease) -> tuple[int, int]:
    batch_id = batch.id
    lost_parts: list[int] = []
    names = {kind: result_blob_name(tenant_id=batch.tenant_id, stem=f"{batch.id}_{kind}") for kind in KINDS}
    with blob_spool(names["output"]) as out_spool, blob_spool(names["error"]) as err_spool:
        out, err = _ResultSpool(out_spool), _ResultSpool(err_spool)
        for shard in Shard.objects.filter(batch_id=batch_id).order_by("index"):
            # Streamed line by line from storage into the result spools: memory stays flat in the size of
            # parts and results; storing a spool is a link on local storage, a chunked upload on S3.
            for _, kind, payload in shard_entries(batch, shard, lost_parts):
                lease.check()  # a clock read per line, a few tens of nanoseconds beside the line's copy
                (out if kind == "out" else err).write(payload)
        completed, failed = out.lines, err.lines
        stored = [
            _store_result(batch, out_spool, "output", completed, names["output"], out.points),
            _store_result(batch, err_spool, "error", failed, names["error"], err.points),
        ]
    with transaction.atomic():
        # The rows go with the batch's end, in its transaction: a finalizer that lost publishes none.
        file_ids = [
            None
            if result is None
            else file_result_create(
                tenant_id=batch.tenant_id,
                filename=result.filename,
                storage_name=result.storage_name,
                size=result.size,
                expires_after=batch.output_expires_after,
                line_offsets=result.line_offsets,
            ).id
            for result in stored
        ]
        for shard_index in lost_parts:
            event_record(
                batch_id=batch_id,
                shard_index=shard_index,
                kind="part_lost",
                message="part missing from storage; its lines are part_lost errors",
            )
        won = batch_finish(
            batch_id=batch_id,
            stop_reason=batch.stop_reason,
            completed=completed,
            failed=failed,
            output_file_id=file_ids[0],
            error_file_id=file_ids[1],
            now=timezone.now(),
        )
        if won is None:
            # Another finalizer finished first; ours must not leave rows behind (its events included).
            transaction.set_rollback(True)
    if won is None:
        for result in stored:
            if result is not None:
                blob_delete(result.storage_name)
    return completed, failed


class _ResultSpool:
    """A result file being written: its lines, its bytes, and a seek point (lines before, byte offset) at the start
    of the first line after each LINE_INDEX_STEP_BYTES written (File.line_offsets)."""

    def __init__(self, spool: IO[bytes]) -> None:
        self.spool = spool
        self.lines = self.size = self.marked = 0
        self.points: list[list[int]] = []

    def write(self, payload: bytes) -> None:
        if self.size - self.marked >= LINE_INDEX_STEP_BYTES:
            self.points.append([self.lines, self.size])
            self.marked = self.size
        self.spool.write(payload)
        self.size += len(payload)
        self.lines += 1


@dataclass(frozen=True)
class _StoredResult:
    """A result blob in storage, before files records its row."""

    filename: str
    storage_name: str
    size: int
    line_offsets: list[list[int]]


def _store_result(
    batch: Batch, content: IO[bytes], kind: str, lines: int, name: str, line_offsets: list[list[int]]
) -> _StoredResult | None:
    """Save one result blob (written to its spool) under ``name``; None when it would hold no line."""
    if lines == 0:
        return None
    size = content.tell()
    blob_save_spooled(name, content)
    return _StoredResult(filename=f"{batch.id}_{kind}.jsonl", storage_name=name, size=size, line_offsets=line_offsets)
