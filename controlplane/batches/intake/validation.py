"""Validation of a batch's input file in one streaming pass, planning the shards as it goes."""

from __future__ import annotations

import contextlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

from controlplane.batches.intake.custom_ids import CustomIds
from controlplane.batches.intake.lines import iter_lines
from controlplane.batches.intake.quickcheck import FastLane, LineFacts
from controlplane.batches.intake.requests import (
    LineIssue,
    ModelResolver,
    line_output_bytes,
    parse_line,
    quota_tokens,
    work_units,
)
from controlplane.batches.pinning import model_snapshot
from controlplane.core.http.errors import quote, storable_text
from controlplane.fleet.models import CatalogueModel, split_model_name
from controlplane.kinds.base import ColumnCollector, EndpointKind
from controlplane.kinds.registry import kind_for

# The batch's errors list stays readable: the first problems name their lines, a count says the rest.
MAX_REPORTED_ERRORS = 100


def shard_seconds_per_unit(model: CatalogueModel) -> float:
    """The model time per work unit shards are cut by: its calls' measured time, else (not measured yet, or a
    generation model) the slot cycle's (fleet/models.py says why the calls' time comes first)."""
    return model.model_seconds_per_work_unit or model.seconds_per_work_unit


@dataclass(frozen=True)
class ShardPlan:
    index: int
    start_line: int
    end_line: int
    start_byte: int
    end_byte: int
    request_count: int
    work_units: int
    columns_name: str = ""  # the shard's columns blob, if it has one (kinds/base.ColumnCollector)
    # Lines whose body the kind refused: answered as 400 lines when the shard runs (no work units).
    body_errors: int = 0
    # Lines per LoRA adapter they name (`tinylm:double` → n), refused lines left out; None when none does.
    adapter_lines: dict[str, int] | None = None


@dataclass
class ValidationResult:
    total: int = 0
    work_units: int = 0
    # What the lines count against the enqueued-token quota: the work units, or more (kinds/base.quota_tokens).
    quota_tokens: int = 0
    # The expected output beyond the lines' envelopes (kinds/base.line_output_bytes), for the storage reservation.
    output_bytes: int = 0
    model: str = ""
    # The catalogue entry's interface the lines were checked against (batches/pinning.py).
    model_snapshot: dict[str, Any] | None = None
    shards: list[ShardPlan] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    error_count: int = 0
    # Lines with a valid envelope and a refused body: they run as 400 lines, they do not fail the batch.
    body_errors: int = 0

    @property
    def ok(self) -> bool:
        return self.error_count == 0

    def add_error(self, code: str, message: str, *, line: int | None, param: str | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            # Messages quote user values (cut to 200 characters); the guard keeps what is saved storable.
            param = None if param is None else storable_text(param, limit=200)
            self.errors.append({"code": code, "message": storable_text(message), "param": param, "line": line})


def validate_input(
    stream: IO[bytes],
    *,
    endpoint: str,
    max_line_bytes: int,
    max_lines: int,
    shard_lines: int,
    shard_seconds: float = 0.0,
    min_shard_lines: int = 1,
    shard_bytes: int | None = None,
    on_shard: Callable[[ShardPlan, ValidationResult], None] | None = None,
    columns_for: Callable[[CatalogueModel], ColumnCollector | None] | None = None,
) -> ValidationResult:
    """Check every line and plan the shards. A shard closes when its estimated model time (work units ×
    the model's measured seconds per unit) reaches ``shard_seconds``, but never below
    ``min_shard_lines`` (or the kind's own floor for the model, EndpointKind.min_shard_lines) or above
    ``shard_lines`` lines; it also closes once it holds ``shard_bytes`` of
    input; ``shard_seconds`` 0 sizes by lines alone. ``on_shard`` hears of each shard as it closes, with
    the result so far (batches/intake/early_dispatch.py runs them while the rest is checked). ``columns_for`` gives
    the collector that keeps each shard's lines as columns for its run (kinds/base.ColumnCollector), once
    the model is known. A line whose envelope is valid but whose body the kind refuses is no error here: it
    is planned with its shard (``body_errors``) and answered with a 400 when the shard runs."""
    result = ValidationResult()
    resolver = ModelResolver()
    # Every accepted line's id, 20 bytes each (spilled to files past a million); duplicates are found after
    # the pass (batches/intake/custom_ids.py).
    custom_ids = CustomIds()
    mixed_lines = array("I")  # lines that drew mixed_models: a duplicate line keeps only its duplicate error
    shard_start: tuple[int, int] | None = None  # (line, byte) of the open shard's first request
    shard_count = shard_work = shard_refused = 0
    shard_adapters: dict[str, int] = {}  # the open shard's lines per adapter (ShardPlan.adapter_lines)
    shard_budget = float("inf")  # work units per shard, known once the model is
    last_line, last_end = 0, 0
    lane: FastLane | None = None  # once the first line named the batch's model: the fast lane for it
    columns: ColumnCollector | None = None

    def close_shard(*, last: bool = False) -> None:
        nonlocal shard_start, shard_count, shard_work, shard_refused, shard_adapters
        if shard_start is not None and shard_count:
            index = len(result.shards)
            # Written before anything can run the shard (on_shard adds it to the database).
            name = columns.close(index=index, request_count=shard_count) if columns is not None else ""
            plan = ShardPlan(
                index,
                shard_start[0],
                last_line,
                shard_start[1],
                last_end,
                shard_count,
                shard_work,
                name,
                shard_refused,
                shard_adapters or None,
            )
            result.shards.append(plan)
            if on_shard is not None and not last:  # the last one goes with the verdict, a moment later
                on_shard(plan, result)
        shard_start, shard_count, shard_work, shard_refused, shard_adapters = None, 0, 0, 0, {}

    for line in iter_lines(stream, max_line_bytes=max_line_bytes):
        if line.is_blank:
            continue
        if line.data is None:
            result.add_error("line_too_long", f"Line is longer than the {max_line_bytes} byte limit.", line=line.number)
            continue
        result.total += 1
        if result.total > max_lines:
            result.add_error(
                "too_many_requests", f"The file has more than {max_lines} requests; split it.", line=line.number
            )
            break
        facts = lane.check(line.data) if lane is not None else None
        laned = facts is not None  # then lane.body is this line's
        refused = False
        parsed = None  # the checked parse's answer, when it ran
        if facts is None:
            try:
                parsed = parse_line(line.data, endpoint=endpoint, resolver=resolver)
            except LineIssue as issue:
                result.add_error(issue.code, issue.message, line=line.number, param=issue.param)
                continue
            refused = parsed.issue is not None
            facts = LineFacts(parsed.custom_id, parsed.model_name, work_units(parsed, endpoint=endpoint))
        custom_ids.add(facts.custom_id, line.number)
        # A batch is one catalogue model; its lines may name the model's LoRA adapters (`base:adapter`) too.
        line_model = split_model_name(facts.model_name)[0]
        if not result.model:
            result.model = line_model
            model = resolver.get(line_model)
            if model is not None:
                lane = FastLane(endpoint=endpoint, model=model)
                result.model_snapshot = model_snapshot(model)
                if columns_for is not None:
                    columns = columns_for(model)
                    laned = lane.check(line.data) is not None  # the first line through the lane as well
            per_unit = shard_seconds_per_unit(model) if model is not None else 0.0
            if shard_seconds > 0 and per_unit > 0:
                shard_budget = shard_seconds / per_unit
            if model is not None:
                min_shard_lines = max(min_shard_lines, kind_for(endpoint).min_shard_lines(model))
        elif line_model != result.model:
            result.add_error(
                "mixed_models",
                f"All requests in a batch must use one model (or its adapters, {quote(result.model + ':<adapter>')}); "
                f"this line uses {quote(facts.model_name)}, earlier lines use {quote(result.model)}.",
                line=line.number,
                param="body.model",
            )
            mixed_lines.append(line.number)
            continue
        if refused:  # its envelope counts (id, model); its body is answered with a 400 when the shard runs
            result.body_errors += 1
            shard_refused += 1
        elif facts.model_name != line_model:  # it names an adapter: that adapter's demand (placement)
            shard_adapters[facts.model_name] = shard_adapters.get(facts.model_name, 0) + 1
        if columns is not None:
            if result.error_count:  # a file that will fail: no columns
                columns.spoil()
            elif laned:
                columns.add(line.number, facts.custom_id, lane.body)  # type: ignore[union-attr]
            else:  # a line only the checked parse took (or refused)
                assert parsed is not None  # the lane declined it, so the checked parse ran
                columns.add_parsed(line.number, parsed)
        if shard_start is None:
            shard_start = (line.number, line.start)
        units = facts.units
        result.work_units += units
        # The fast lane's kinds count their work units; a checked parse asks the kind.
        if parsed is None:
            result.quota_tokens += units
        else:
            result.quota_tokens += quota_tokens(parsed, endpoint=endpoint)
            result.output_bytes += line_output_bytes(parsed, endpoint=endpoint)
        shard_count += 1
        shard_work += units
        last_line, last_end = line.number, line.end
        too_big = shard_bytes is not None and shard_start is not None and line.end - shard_start[1] >= shard_bytes
        if shard_count >= shard_lines or too_big or (shard_work >= shard_budget and shard_count >= min_shard_lines):
            close_shard()
    close_shard(last=True)
    _report_duplicates(result, custom_ids.duplicates(), mixed_lines)
    if result.total == 0 and result.error_count == 0:
        result.add_error("empty_file", "The input file has no requests.", line=None)
    return result


def _report_duplicates(result: ValidationResult, duplicates: list[tuple[int, int, str]], mixed_lines: array) -> None:
    """A line whose id an earlier line used gets duplicate_custom_id, and only that (as when it was checked in
    the pass: a duplicate line was never checked further). The listed errors stay the first ones by line;
    if more than MAX_REPORTED_ERRORS were found and a listed mixed_models error gives way, the list is shorter
    by that many (the count stays exact)."""
    if not duplicates:
        return
    lines = {line for line, _, _ in duplicates}
    superseded = {line for line in mixed_lines if line in lines}
    if superseded:
        result.error_count -= len(superseded)
        result.errors = [e for e in result.errors if not (e["code"] == "mixed_models" and e["line"] in superseded)]
    listed = result.errors
    result.errors = []
    for line, first, custom_id in duplicates:
        result.add_error(
            "duplicate_custom_id",
            f"custom_id {quote(custom_id)} is also used on line {first}; ids must be unique.",
            line=line,
            param="custom_id",
        )
    # Back in line order with the other errors; lineless ones (none exist before this point) would sort last.
    merged = sorted([*listed, *result.errors], key=lambda e: (e["line"] is None, e["line"] or 0))
    result.errors = merged[:MAX_REPORTED_ERRORS]


class BatchColumns:
    """What validation calls once it knows the batch's model (``columns_for``): the kind's collector for a
    model whose shards can have columns, else None. ``discard`` deletes what it wrote, when the batch did not
    start (the columns then name no shard; files/storage_gc.py would collect them after its grace period)."""

    def __init__(self, *, kind: EndpointKind, batch_id: str, attempt: int, save: Any, delete: Any) -> None:
        self.kind, self.batch_id, self.attempt, self._save, self._delete = kind, batch_id, attempt, save, delete
        self.collector: ColumnCollector | None = None

    def __call__(self, model: CatalogueModel) -> ColumnCollector | None:
        self.collector = self.kind.columns_collector(
            model, batch_id=self.batch_id, attempt=self.attempt, save=self._save
        )
        return self.collector

    def discard(self) -> None:
        for name in self.collector.written if self.collector is not None else []:
            with contextlib.suppress(OSError):
                self._delete(name)
