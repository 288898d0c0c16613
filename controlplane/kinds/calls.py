"""Request/response kinds (embeddings, tensors): ``CallKind.run`` packs a shard's lines into Triton calls up to
the model's max_batch_size and keeps ``inflight`` calls in flight so Triton's dynamic batcher stays full; each
line is reported as soon as its last piece is back. A call Triton rejects permanently is split to pin the
error on the one line that caused it (a 400 line, not a failed shard)."""

from __future__ import annotations

import contextvars
import time
from abc import abstractmethod
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import Backend, Call, EndpointKind, LineFailure, Member, ParsedLine, RunControl
from controlplane.triton.client import PermanentTritonError

# How long the loop waits for a call before it looks at the control again.
CHECK_INTERVAL_SECONDS = 1.0
# After a stop, calls already sent get this long to answer before they are abandoned (a healthy Triton
# answers in well under a second; a hung one would hold the cancel until the call deadline).
STOP_GRACE_SECONDS = 1.0


def members_per_line(calls: list[Call]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for call in calls:
        for member in call.members:
            counts[member.line] = counts.get(member.line, 0) + 1
    return counts


def min_calls(backend: Backend, inflight: int) -> int:
    """Texts are split into this many calls at least: enough to spread a shard over the model's instances,
    no more. Past the instance count a split only makes executions smaller: Triton's batcher does not split
    a call, so three calls of ~22 texts fill a 64-text execution with two (MiniLM, one instance: 0.69 →
    0.75 of the ceiling end to end, docs/performance.md)."""
    return inflight if not backend.instances else min(inflight, backend.instances)


class CallKind(EndpointKind):
    """A kind whose line is one request and one response: packed into calls, answered per call."""

    @abstractmethod
    def pack(
        self, lines: dict[int, ParsedLine], *, max_batch_size: int, min_calls: int, equal_cost: bool
    ) -> list[Call]:
        """Every piece of every line in exactly one call; no call over ``max_batch_size`` rows. ``equal_cost``:
        calls of texts cost alike (CPU instances), else hold alike (GPU ones: a pass costs its launches)."""

    @abstractmethod
    def call_pieces(self, call: Call, outputs: dict[str, np.ndarray]) -> list[tuple[Member, Any]]:
        """A call's outputs, cut into its members' pieces (converted once per call)."""

    def run(
        self,
        lines: dict[int, ParsedLine],
        *,
        model: CatalogueModel,
        backend: Backend,
        control: RunControl,
        inflight: int,
        calls: list[Call] | None = None,
    ) -> bool:
        runnable = {}
        for number, parsed in lines.items():
            if parsed.issue is not None:  # refused at validation: answered without a call
                control.finish(number, LineFailure.refused(parsed.issue))
            else:
                runnable[number] = parsed
        if calls is None:
            calls = self.pack(
                runnable,
                max_batch_size=model.rows_per_call,
                min_calls=min_calls(backend, inflight),
                equal_cost=not backend.gpus,
            )
        return _CallRun(self, runnable, model, backend, control).run(calls, inflight)


class _CallRun:
    def __init__(
        self,
        kind: CallKind,
        lines: dict[int, ParsedLine],
        model: CatalogueModel,
        backend: Backend,
        control: RunControl,
    ) -> None:
        self.kind, self.lines, self.model, self.backend, self.control = kind, lines, model, backend, control
        # Per line, per slot: the line's pieces of its calls' results, until its last one is back.
        self.pieces: dict[int, dict[int, Any]] = {n: {} for n in lines}
        self.errors: dict[int, str] = {}
        self.remaining: dict[int, int] = {}

    def run(self, calls: list[Call], inflight: int) -> bool:
        self.remaining = members_per_line(calls)
        stopped_at: float | None = None
        abandoned = False
        queue = list(reversed(calls))
        pool = ThreadPoolExecutor(max_workers=inflight)
        running: dict[Future[list[tuple[Any, Any]]], Call] = {}
        try:
            while queue or running:
                while queue and stopped_at is None and len(running) < inflight:
                    call = queue.pop()
                    # The shard's context (its trace span, its log ids) goes with each call into the pool.
                    running[pool.submit(contextvars.copy_context().run, self._execute, call)] = call
                if not running:
                    break
                done, _ = wait(running, timeout=CHECK_INTERVAL_SECONDS, return_when=FIRST_COMPLETED)
                for future in done:
                    running.pop(future)
                    self._collect(future.result())  # a TransientTritonError propagates from here
                if self.control.check() and stopped_at is None:
                    stopped_at = time.monotonic()
                if stopped_at is not None and running and time.monotonic() - stopped_at >= STOP_GRACE_SECONDS:
                    # Stopping, and calls still out after a grace: a hung Triton may hold them until the
                    # call deadline (minutes), and the cancel/expiry must not wait for it (tests/chaos).
                    # Their lines are simply not reported: finalization reports them as stopped.
                    abandoned = True
                    break
        finally:
            pool.shutdown(wait=not abandoned, cancel_futures=True)
        return stopped_at is not None

    def _execute(self, call: Call) -> list[tuple[Any, Any]]:
        """Run a call; if Triton rejects it, run its members one by one to pin the error to a line."""
        try:
            outputs = self.backend.infer(self.model.triton_name, call.inputs, call.output_names)
            return self.kind.call_pieces(call, outputs)
        except PermanentTritonError as exc:
            if len(call.members) == 1:
                return [(call.members[0], exc)]
            return [pair for single in call.split() for pair in self._execute(single)]

    def _collect(self, pairs: list[tuple[Any, Any]]) -> None:
        for member, outcome in pairs:
            if isinstance(outcome, Exception):
                self.errors.setdefault(member.line, str(outcome))
            else:
                self.pieces[member.line][member.slot] = outcome
            self.remaining[member.line] -= 1
            if self.remaining[member.line] == 0:
                number = member.line
                if number in self.errors:
                    self.control.finish(number, LineFailure(400, "invalid_request", self.errors[number]))
                else:
                    self.control.finish(number, self.kind.render(self.lines[number], self.pieces[number]))
                del self.pieces[number]
