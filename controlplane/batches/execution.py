"""Running one shard the scheduler claimed (scheduling/runner.py): pack its requests into Triton calls with
several in flight, write a part, and commit it under the attempt number. Cancel/expiry stop it between
calls, keeping the lines already done. A keeper thread renews the lease for the whole run (model load and
part upload included).

Whose fault a failure is decides what it costs (shards.shard_release):
- infrastructure, free: TransientTritonError (Triton unreachable, restarting, overloaded, model not
  loaded, NoCapacity), a model that cannot be loaded, storage I/O (OSError), and a database error or a
  killed worker (the lease expires and the rescuer puts the shard back);
- content, spends one of SHARD_MAX_ATTEMPTS: any other exception while processing the shard's own data;
- neither: a PermanentTritonError of a call is pinned to the one line that caused it (a 400 line)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError

from controlplane.batches.backend import InferenceBackend
from controlplane.batches.columns import columns_load
from controlplane.batches.fastparse import ValidatedTensorLines
from controlplane.batches.finalize import batch_try_finalize
from controlplane.batches.leases import LeaseKeeper
from controlplane.batches.lines import iter_lines
from controlplane.batches.models import Shard, ShardStatus
from controlplane.batches.packing import (
    Call,
    call_rows,
    embedding_body,
    members_per_line,
    pack_embeddings,
    pack_tensors,
    slice_outputs,
    tensor_body,
)
from controlplane.batches.parts import encode_entry
from controlplane.batches.pinning import pinned_model
from controlplane.batches.records import failed_response_record, output_record
from controlplane.batches.requests import ModelResolver, ParsedLine, parse_line
from controlplane.batches.shards import PartSummary, batch_stop_requested, shard_commit, shard_release, shard_renew
from controlplane.core import metrics
from controlplane.core.database import when_database_answers
from controlplane.files.models import File
from controlplane.files.storage import blob_delete, blob_read_range, blob_save_spooled, blob_spool
from controlplane.fleet.models import CatalogueModel, ModelKind
from controlplane.triton.client import PermanentTritonError, TransientTritonError

logger = logging.getLogger(__name__)

# How often a running shard looks at its batch for a cancel/expiry (its keeper renews the lease).
CHECK_INTERVAL_SECONDS = 1.0
# After a stop, calls already sent get this long to answer before they are abandoned (a healthy Triton
# answers in well under a second; a hung one would hold the cancel until the call deadline).
STOP_GRACE_SECONDS = 1.0


class LeaseLost(Exception):
    """Another attempt owns the shard now; this one must stop and publish nothing."""


def shard_execute(*, shard: Shard, model: CatalogueModel, backend: InferenceBackend) -> str:
    """Run a shard this caller has claimed, publish its part under the attempt number, and finalize the
    batch if it was the last one. Returns succeeded, stopped, stale, lease_lost, deferred (infrastructure:
    back to pending, nothing spent), retry (its content failed: back to pending, one attempt spent),
    dead, or skipped (its batch is stopping)."""
    started = time.monotonic()
    renew = partial(shard_renew, shard_id=shard.id, attempt=shard.attempt)
    failure: Exception | None = None
    summary: PartSummary | None = None
    with LeaseKeeper(renew, name=f"shard-{shard.id}-lease") as keeper:
        try:
            summary = _produce_part(shard, model, backend, keeper)
        except LeaseLost:
            logger.warning("shard %s attempt %s lost its lease; discarding its work", shard.id, shard.attempt)
            return "lease_lost"
        except DatabaseError:
            # The database went away under the shard (a restart): give the shard back as soon as it answers
            # again, rather than leave it to its lease and the rescuer (tests/chaos: the batch's last shards
            # waited 8 s for that). If it stays away, the lease expires and the rescuer takes over.
            _release_when_database_answers(shard)
            raise
        except Exception as exc:  # noqa: BLE001 - classified below, and recorded on the shard
            failure = exc
    if failure is not None:
        return _give_back(shard, failure)
    assert summary is not None
    try:
        committed = shard_commit(shard_id=shard.id, attempt=shard.attempt, summary=summary)
    except DatabaseError:
        # Whether the commit landed is unknown; the release is fenced, so it changes nothing if it did.
        _release_when_database_answers(shard)
        raise
    if not committed:
        blob_delete(summary.part_name)
        return "stale"
    metrics.shard_committed(
        model=model.name, completed=summary.completed, failed=summary.failed, seconds=time.monotonic() - started
    )
    batch_try_finalize(batch_id=shard.batch_id)
    return "stopped" if summary.stopped else "succeeded"


def _release_when_database_answers(shard: Shard) -> None:
    release = partial(
        shard_release,
        shard_id=shard.id,
        attempt=shard.attempt,
        error="database connection lost (a restart?)",
        content_failure=False,
    )
    try:
        when_database_answers(release, within_s=settings.SHARD_LEASE_SECONDS)  # fenced by the attempt
    except DatabaseError:
        logger.warning("shard %s attempt %s: database still away; leaving it to its lease", shard.id, shard.attempt)


def _produce_part(shard: Shard, model: CatalogueModel, backend: InferenceBackend, keeper: LeaseKeeper) -> PartSummary:
    if shard.batch.model_snapshot:
        model = pinned_model(shard.batch.model_snapshot)  # the entry the batch was validated against
    # Columns: the arrays validation kept of a tensor shard's lines (batches/columns.py); else parse them.
    columns = columns_load(shard, model)
    if columns is not None:
        model_name = shard.batch.model  # every line names it (validation refuses mixed models)
        lines = {n: ParsedLine(c, model_name, None) for n, c in zip(columns.numbers, columns.custom_ids, strict=True)}
        calls = columns.calls(model.max_batch_size, [spec["name"] for spec in model.outputs])
    else:
        lines, calls = _read_shard(shard), None
    Shard.objects.filter(id=shard.id, attempt=shard.attempt).update(triton_server=backend.server[:200])
    try:
        backend.prepare(model.triton_name)  # may load the model: seconds, under the keeper's renewals
    except PermanentTritonError as exc:
        # A model that will not load is the fleet's problem, not this shard's: wait for it for free.
        raise TransientTritonError(f"model {model.triton_name!r} could not be prepared: {exc}") from exc
    if keeper.lost.is_set():
        raise LeaseLost()
    runner = _ShardRunner(shard, model, lines, backend, keeper, calls)
    entries, stopped = runner.run()
    return _write_part(shard, runner, entries, stopped)


def _is_infrastructure(exc: Exception) -> bool:
    # A missing input blob is not an outage: retrying cannot bring it back, so it spends attempts.
    return isinstance(exc, (TransientTritonError, OSError)) and not isinstance(exc, FileNotFoundError)


def _give_back(shard: Shard, exc: Exception) -> str:
    content_failure = not _is_infrastructure(exc)
    if content_failure:
        logger.exception("shard %s attempt %s failed on its content", shard.id, shard.attempt, exc_info=exc)
        error = f"{type(exc).__name__}: {exc}"
    else:
        error = str(exc) or type(exc).__name__
    status = shard_release(shard_id=shard.id, attempt=shard.attempt, error=error, content_failure=content_failure)
    shard.last_error = error
    if status is None:
        return "lease_lost"
    if status in (ShardStatus.DEAD, ShardStatus.SKIPPED):
        batch_try_finalize(batch_id=shard.batch_id)
        return str(status)
    return "retry" if content_failure else "deferred"


def _read_shard(shard: Shard) -> dict[int, ParsedLine]:
    batch = shard.batch
    name = File.objects.only("storage_name").get(id=batch.input_file_id).storage_name
    pinned = pinned_model(batch.model_snapshot) if batch.model_snapshot else None
    resolver = ModelResolver(pinned)
    fast = ValidatedTensorLines(pinned) if pinned is not None and pinned.kind == ModelKind.TENSOR else None
    lines: dict[int, ParsedLine] = {}
    # Only the shard's byte range is fetched (an HTTP Range GET on S3), and streamed line by line.
    with blob_read_range(name, shard.start_byte, shard.end_byte) as stream:
        for line in iter_lines(
            stream,
            max_line_bytes=settings.BATCH_MAX_LINE_BYTES,
            start_byte=shard.start_byte,
            end_byte=shard.end_byte,
            first_line_number=shard.start_line,
        ):
            if line.is_blank or line.data is None:
                continue
            # Validation accepted every line already, against the same pinned entry: tensors skip the
            # checks (batches/fastparse.py) and fall back to the checked parse for anything unusual.
            parsed = fast.parse(line.data) if fast is not None else None
            lines[line.number] = parsed or parse_line(line.data, endpoint=batch.endpoint, resolver=resolver)
    return lines


class _ShardRunner:
    def __init__(
        self,
        shard: Shard,
        model: CatalogueModel,
        lines: dict[int, ParsedLine],
        backend: InferenceBackend,
        keeper: LeaseKeeper,
        calls: list[Call] | None = None,
    ):
        self.shard = shard
        self.calls = calls  # already packed (from the shard's columns)
        self.keeper = keeper
        self.model = model
        self.lines = lines
        self.backend = backend
        # Per line, per slot: an embedding text's output slices, or a tensor line's (CallRows, Member).
        self.results: dict[int, dict[int, Any]] = {n: {} for n in lines}
        self.errors: dict[int, str] = {}
        # Each finished line's part entry, encoded as it finishes (parts.encode_entry).
        self.entries: dict[int, bytes] = {}
        self.completed = self.failed = self.tokens = 0

    def run(self) -> tuple[list[bytes], bool]:
        """The part's entries in line order, and whether a stop left some lines out."""
        if self.calls is not None:
            calls = self.calls
        elif self.model.kind == ModelKind.EMBEDDINGS:
            calls = pack_embeddings(self.lines, self.model.max_batch_size, min_calls=self._min_calls())
        else:
            calls = pack_tensors(self.lines, self.model.max_batch_size)
        self.remaining = members_per_line(calls)
        stopped_at: float | None = None
        abandoned = False
        last_check = time.monotonic()
        queue = list(reversed(calls))
        pool = ThreadPoolExecutor(max_workers=settings.DISPATCH_INFLIGHT_CALLS)
        running: dict[Future[list[tuple[Any, Any]]], Call] = {}
        try:
            while queue or running:
                while queue and stopped_at is None and len(running) < settings.DISPATCH_INFLIGHT_CALLS:
                    call = queue.pop()
                    running[pool.submit(self._execute, call)] = call
                if not running:
                    break
                done, _ = wait(running, timeout=CHECK_INTERVAL_SECONDS, return_when=FIRST_COMPLETED)
                for future in done:
                    running.pop(future)
                    self._collect(future.result())  # a TransientTritonError propagates from here
                if self.keeper.lost.is_set():
                    raise LeaseLost()
                if stopped_at is not None and running and time.monotonic() - stopped_at >= STOP_GRACE_SECONDS:
                    # Stopping, and calls still out after a grace: a hung Triton may hold them until the
                    # call deadline (minutes), and the cancel/expiry must not wait for it (tests/chaos).
                    # Their lines are simply not in the part: finalization reports them as stopped.
                    abandoned = True
                    break
                if stopped_at is None and time.monotonic() - last_check >= CHECK_INTERVAL_SECONDS:
                    last_check = time.monotonic()
                    if batch_stop_requested(batch_id=self.shard.batch_id):
                        stopped_at = last_check
        finally:
            pool.shutdown(wait=not abandoned, cancel_futures=True)
        stopped = stopped_at is not None
        return [self.entries[n] for n in sorted(self.entries)], stopped and len(self.entries) < len(self.lines)

    def _min_calls(self) -> int:
        """Texts are split into this many calls at least: enough to spread a shard over the model's instances,
        no more. Past the instance count a split only makes executions smaller: Triton's batcher does not
        split a call, so three calls of ~22 texts fill a 64-text execution with two (MiniLM, one instance:
        0.69 → 0.75 of the ceiling end to end, docs/PERFORMANCE.md)."""
        instances = self.backend.instances
        return settings.DISPATCH_INFLIGHT_CALLS if not instances else min(settings.DISPATCH_INFLIGHT_CALLS, instances)

    def _execute(self, call: Call) -> list[tuple[Any, Any]]:
        """Run a call; if Triton rejects it, run its members one by one to pin the error to a line."""
        try:
            outputs = self.backend.infer(self.model.triton_name, call.inputs, call.output_names)
            if self.model.kind == ModelKind.TENSOR:
                rows = call_rows(outputs)
                return [(m, (rows, m)) for m in call.members]
            return [(m, slice_outputs(outputs, m)) for m in call.members]
        except PermanentTritonError as exc:
            if len(call.members) == 1:
                return [(call.members[0], exc)]
            return [pair for single in call.split() for pair in self._execute(single)]

    def _collect(self, pairs: list[tuple[Any, Any]]) -> None:
        for member, outcome in pairs:
            if isinstance(outcome, Exception):
                self.errors.setdefault(member.line, str(outcome))
            else:
                self.results[member.line][member.slot] = outcome
            self.remaining[member.line] -= 1
            if self.remaining[member.line] == 0:
                self._finish_line(member.line)

    def _finish_line(self, number: int) -> None:
        parsed = self.lines[number]
        batch_id = self.shard.batch_id
        if number in self.errors:
            record = failed_response_record(
                batch_id,
                number,
                parsed.custom_id,
                status_code=400,
                message=self.errors[number],
                code="invalid_request",
            )
            self.entries[number] = encode_entry(number, "err", record)
            self.failed += 1
        else:
            if self.model.kind == ModelKind.EMBEDDINGS:
                body, tokens = embedding_body(parsed, self.results[number])
                self.tokens += tokens
            else:
                rows, member = self.results[number][0]
                body = tensor_body(parsed.model_name, rows, member)
            self.entries[number] = encode_entry(number, "out", output_record(batch_id, number, parsed.custom_id, body))
            self.completed += 1
        del self.results[number]


def _write_part(shard: Shard, runner: _ShardRunner, entries: list[bytes], stopped: bool) -> PartSummary:
    # The attempt in the name keeps a stale attempt's part from ever replacing the committed one.
    name = f"parts/{shard.batch_id}/{shard.index:06d}.attempt{shard.attempt}.jsonl"
    with blob_spool(name) as spool:  # written once: on local storage linked into place, not copied
        spool.writelines(entries)
        blob_save_spooled(name, spool)
    return PartSummary(
        part_name=name, completed=runner.completed, failed=runner.failed, prompt_tokens=runner.tokens, stopped=stopped
    )
