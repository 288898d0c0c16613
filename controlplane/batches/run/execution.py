"""Running one shard the scheduler claimed (through services.shard_run): its endpoint kind runs the lines (packed
into Triton calls with several in flight, for request/response kinds), a part is written and committed under
the attempt number. Cancel/expiry stop it between calls, keeping the lines already done. A keeper thread
renews the lease for the whole run (model load and part upload included).

Whose fault a failure is decides what it costs (shards.shard_release):
- infrastructure, free: TransientTritonError (Triton unreachable, restarting, overloaded, model not
  loaded, NoCapacity), a model that cannot be loaded, storage I/O (OSError), and a database error or a
  killed worker (the lease expires and the rescuer puts the shard back);
- content, spends one of SHARD_MAX_ATTEMPTS: any other exception while processing the shard's own data;
- neither: a PermanentTritonError of a call is pinned to the one line that caused it (a 400 line)."""

from __future__ import annotations

import logging
import time
from functools import partial

from django.conf import settings
from django.db import DatabaseError

from controlplane.batches.intake.lines import iter_lines
from controlplane.batches.intake.requests import ModelResolver, parse_line
from controlplane.batches.leases import LeaseKeeper
from controlplane.batches.models import Shard, ShardStatus
from controlplane.batches.pinning import pinned_model
from controlplane.batches.run.parts import encode_entry
from controlplane.batches.run.records import failed_response_record, output_record
from controlplane.batches.run.records import request_id as line_request_id
from controlplane.batches.selectors import batch_input_name
from controlplane.batches.shards import PartSummary, batch_stop_requested, shard_commit, shard_release, shard_renew
from controlplane.core.observability import metrics, tracing
from controlplane.core.workers.database import when_database_answers
from controlplane.files.storage import blob_delete, blob_read_range, blob_save_spooled, blob_spool
from controlplane.fleet.models import ADAPTER_SEPARATOR, CatalogueModel
from controlplane.kinds.base import Backend, Call, EndpointKind, LineFailure, LineOutcome, ParsedLine, TokenCounts
from controlplane.kinds.registry import kind_for
from controlplane.triton.client import PermanentTritonError, TransientTritonError

logger = logging.getLogger(__name__)

# How often a running shard looks at its batch for a cancel/expiry (its keeper renews the lease).
CHECK_INTERVAL_SECONDS = 1.0
# shard_execute's outcomes that close the shard (committed, or given up): the batch may be finished.
SHARD_CLOSED_OUTCOMES = frozenset({"succeeded", "stopped", "dead", "skipped"})


class LeaseLost(Exception):
    """Another attempt owns the shard now; this one must stop and publish nothing."""


def shard_execute(*, shard: Shard, model: CatalogueModel, backend: Backend) -> str:
    """Run a shard this caller has claimed and publish its part under the attempt number; its caller
    (services.shard_run) then finalizes the batch if this shard closed its last. Returns succeeded, stopped, stale, lease_lost, deferred (infrastructure:
    back to pending, nothing spent), retry (its content failed: back to pending, one attempt spent),
    dead, or skipped (its batch is stopping)."""
    attributes = {
        "batch.id": shard.batch_id,
        "shard.id": shard.id,
        "shard.index": shard.index,
        "shard.attempt": shard.attempt,
        "shard.lines": shard.request_count,
        "model": model.name,
        "triton.server": backend.server,
    }
    # One span per shard attempt under the batch's trace (core/observability/tracing.py); its Triton calls are its children.
    with tracing.batch_span("shard.run", traceparent=shard.batch.trace_parent, attributes=attributes) as span:
        line_errors = tracing.LineErrors(span)
        outcome = _shard_execute(shard, model, backend, line_errors)
        line_errors.close()
        if span is not None:
            span.set_attribute("shard.outcome", outcome)
            if outcome not in ("succeeded", "stopped", "skipped"):
                tracing.span_fail(span, f"{outcome}: {shard.last_error or ''}")
    return outcome


def _shard_execute(shard: Shard, model: CatalogueModel, backend: Backend, line_errors: tracing.LineErrors) -> str:
    started = time.monotonic()
    renew = partial(shard_renew, shard_id=shard.id, attempt=shard.attempt)
    failure: Exception | None = None
    summary: PartSummary | None = None
    with LeaseKeeper(renew, name=f"shard-{shard.id}-lease") as keeper:
        try:
            summary = _produce_part(shard, model, backend, keeper, line_errors)
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


def _produce_part(
    shard: Shard, model: CatalogueModel, backend: Backend, keeper: LeaseKeeper, line_errors: tracing.LineErrors
) -> PartSummary:
    if shard.batch.model_snapshot:
        model = pinned_model(shard.batch.model_snapshot)  # the entry the batch was validated against
    kind = kind_for(shard.batch.endpoint)
    # Columns: the arrays validation kept of the shard's lines (a kind's fast path); else parse them.
    packed = kind.columns_run(
        name=shard.columns_name,
        first_line=shard.start_line,
        last_line=shard.end_line,
        request_count=shard.request_count,
        model=model,
    )
    calls: list[Call] | None = None
    if packed is not None:
        lines, calls = packed
    else:
        lines = _read_shard(shard, kind)
    Shard.objects.filter(id=shard.id, attempt=shard.attempt).update(triton_server=backend.server[:200])
    try:
        backend.prepare(model.triton_name)  # may load the model: seconds, under the keeper's renewals
    except PermanentTritonError as exc:
        # A model that will not load is the fleet's problem, not this shard's: wait for it for free.
        raise TransientTritonError(f"model {model.triton_name!r} could not be prepared: {exc}") from exc
    if keeper.lost.is_set():
        raise LeaseLost()
    part = _PartEntries(shard, lines, keeper, line_errors)
    stop_requested = kind.run(
        lines, model=model, backend=backend, control=part, inflight=settings.DISPATCH_INFLIGHT_CALLS, calls=calls
    )
    entries = [part.entries[n] for n in sorted(part.entries)]
    return _write_part(shard, part, entries, stop_requested and len(part.entries) < len(lines))


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
        return str(status)
    return "retry" if content_failure else "deferred"


def _read_shard(shard: Shard, kind: EndpointKind) -> dict[int, ParsedLine]:
    batch = shard.batch
    name = batch_input_name(batch)
    pinned = pinned_model(batch.model_snapshot) if batch.model_snapshot else None
    resolver = ModelResolver(pinned)
    # Validation accepted every line already, against the same pinned entry: a kind's fast parser skips the
    # checks, falling back to the checked parse for anything unusual. Not in a shard with refused lines:
    # only the checked parse tells them apart (and gives the same BodyIssue validation found).
    fast = kind.fast_parser(pinned) if pinned is not None and not shard.body_errors else None
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
            parsed = fast(line.data) if fast is not None else None
            lines[line.number] = parsed or parse_line(line.data, endpoint=batch.endpoint, resolver=resolver)
    return lines


class _PartEntries:
    """The kind's RunControl for one shard: each finished line becomes its part entry (encoded once, as it
    finishes), and ``check`` watches the lease and, once a second, the batch for a cancel/expiry."""

    def __init__(
        self, shard: Shard, lines: dict[int, ParsedLine], keeper: LeaseKeeper, line_errors: tracing.LineErrors
    ) -> None:
        self.shard, self.lines, self.keeper, self.line_errors = shard, lines, keeper, line_errors
        self.entries: dict[int, bytes] = {}
        self.completed = self.failed = 0
        self.tokens = TokenCounts()
        self.adapter_usage: dict[str, list[int]] = {}  # shards.PartSummary.adapter_usage
        self._last_check = time.monotonic()
        self._stopping = False

    def check(self) -> bool:
        if self.keeper.lost.is_set():
            raise LeaseLost()
        if not self._stopping and time.monotonic() - self._last_check >= CHECK_INTERVAL_SECONDS:
            self._last_check = time.monotonic()
            self._stopping = batch_stop_requested(batch_id=self.shard.batch_id)
        return self._stopping

    def request_id(self, number: int) -> str:
        return line_request_id(self.shard.batch_id, number)

    def finish(self, number: int, outcome: LineOutcome) -> None:
        custom_id = self.lines[number].custom_id
        batch_id = self.shard.batch_id
        if isinstance(outcome, LineFailure):
            record = failed_response_record(
                batch_id,
                number,
                custom_id,
                status_code=outcome.status_code,
                message=outcome.message,
                code=outcome.code,
                param=outcome.param,
            )
            self.entries[number] = encode_entry(number, "err", record)
            self.failed += 1
            self.line_errors.add(line=number, code=outcome.code)
        else:
            self.entries[number] = encode_entry(number, "out", output_record(batch_id, number, custom_id, outcome.body))
            t = self.tokens
            self.tokens = TokenCounts(
                t.input + outcome.tokens,
                t.output + outcome.completion_tokens,
                t.cached + outcome.cached_tokens,
                t.choices + outcome.choices,
            )
            self.completed += 1
            model_name = self.lines[number].model_name
            if ADAPTER_SEPARATOR in model_name:  # a LoRA adapter's line: the ledger bills it under its own name
                counts = self.adapter_usage.setdefault(model_name, [0, 0, 0, 0, 0])
                for index, value in enumerate(
                    (1, outcome.tokens, outcome.completion_tokens, outcome.cached_tokens, outcome.choices)
                ):
                    counts[index] += value


def _write_part(shard: Shard, runner: _PartEntries, entries: list[bytes], stopped: bool) -> PartSummary:
    # The attempt in the name keeps a stale attempt's part from ever replacing the committed one.
    name = f"parts/{shard.batch_id}/{shard.index:06d}.attempt{shard.attempt}.jsonl"
    with blob_spool(name) as spool:  # written once: on local storage linked into place, not copied
        spool.writelines(entries)
        blob_save_spooled(name, spool)
    return PartSummary(
        part_name=name,
        completed=runner.completed,
        failed=runner.failed,
        tokens=runner.tokens,
        stopped=stopped,
        adapter_usage=runner.adapter_usage or None,
    )
