"""Running a shard of generation lines: one generation stream to the backend's server, a bounded number of
lines in flight, each line reported the moment its final response arrives.

- In flight: 2 × the model's ``max_num_seqs`` (vLLM's run_batch keeps as many): the engine always has the
  next line queued when one finishes, and the KV budget, not this loop, decides how many decode at once.
  More are submitted as lines finish, so a long generation never holds back the lines behind it. The lines out
  are also bounded by the output they may write (units.line_output_bytes at max_tokens, ≤
  GENERATION_INFLIGHT_OUTPUT_BYTES, always at least one line): answers arrive whole and wait in this loop's
  inbox until read, so lines of n 8 and top_logprobs 20 (~10 MB each) are held back from the engine rather
  than piling up in the worker's memory.
- Stop (cancel, expiry): nothing new is sent and the stream is closed with cancel, which Triton turns into
  ``is_cancelled()`` for every request still on it (the engine stops them within a step); the lines not
  finished are left out, and finalization reports them as stopped. Finished lines are kept, answers already
  received but not yet read included.
- Errors, per line: a permanent Triton error (the engine refused the request) is a 400 line; an answer that
  cannot be this line's completion (EngineAnswerError) a 500 line. A transient one (the server went away,
  the stream broke, the model unloaded) raises: the shard is given back without spending an attempt
  (batches/run/execution.py) and regenerated whole, so no line is written twice.
- Silence: no response at all for TRITON_TIMEOUT_SECONDS while lines are in flight is a hung server
  (transient). Lines are sent unstreamed (one response each), so the limit must exceed the longest
  single generation a busy engine takes; operators raise TRITON_TIMEOUT_SECONDS for long-output models.
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from django.conf import settings

from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import Backend, LineFailure, LineOutput, ParsedLine, RunControl
from controlplane.kinds.generation.engine import EngineAnswerError, engine_request, engine_result
from controlplane.kinds.generation.units import line_output_bytes
from controlplane.triton.errors import PermanentTritonError, TransientTritonError
from controlplane.triton.streaming import GenerationResponse

# How long the loop waits for a response before it looks at the control again: a stop is acted on within
# this (plus the control's own once-a-second look at the batch).
POLL_SECONDS = 0.2
# Sequences an instance decodes at once when the catalogue does not say (vLLM's default max_num_seqs is 256;
# a small default keeps an unknown engine's queue short).
DEFAULT_MAX_NUM_SEQS = 16
# Prompts that agree on their first this many tokens are sent together (two of tinylm's 16-token prefix-cache
# blocks; vLLM's blocks are 16 tokens too).
PREFIX_KEY_TOKENS = 32


def inflight_limit(model: CatalogueModel) -> int:
    return 2 * (model.max_num_seqs or DEFAULT_MAX_NUM_SEQS)


def run_generation(
    lines: dict[int, ParsedLine],
    *,
    model: CatalogueModel,
    backend: Backend,
    control: RunControl,
    render: Callable[[ParsedLine, dict[int, Any]], LineOutput],
    request_of: Callable[[ParsedLine], Any],
) -> bool:
    """Run ``lines`` (refused ones are answered at once); returns whether a stop was requested."""
    numbers: list[int] = []
    for number, parsed in lines.items():
        if parsed.issue is not None:
            control.finish(number, LineFailure.refused(parsed.issue))
        else:
            numbers.append(number)
    if not numbers:
        return control.check()
    return _StreamRun(lines, model, backend, control, render, request_of).run(
        deque(_grouped_by_prefix(numbers, lambda number: request_of(lines[number]).prompt_token_ids))
    )


def _grouped_by_prefix(numbers: list[int], token_ids: Callable[[int], tuple[int, ...]]) -> list[int]:
    """Lines whose prompts start alike (a system prompt, few-shot examples) one after another, so the engine's
    prefix cache (LRU) still holds the prefix when the next arrives. Groups keep the order of their first line,
    lines their order within a group: a shard without shared prefixes is sent in file order."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for number in numbers:
        groups.setdefault(tuple(token_ids(number)[:PREFIX_KEY_TOKENS]), []).append(number)
    return [number for group in groups.values() for number in group]


class _StreamRun:
    def __init__(
        self,
        lines: dict[int, ParsedLine],
        model: CatalogueModel,
        backend: Backend,
        control: RunControl,
        render: Callable[[ParsedLine, dict[int, Any]], LineOutput],
        request_of: Callable[[ParsedLine], Any],
    ) -> None:
        self.lines, self.model, self.backend, self.control = lines, model, backend, control
        self.render, self.request_of = render, request_of
        self.inbox: queue.Queue[GenerationResponse] = queue.Queue()
        self.running: dict[str, int] = {}  # Triton request id → line number
        self.output_bytes: dict[str, int] = {}  # the most each line out may write (its share of the window)
        self.window_bytes = 0
        # A line's last response with a body: a final response may come empty (Triton's empty final flag).
        self.last: dict[str, GenerationResponse] = {}

    def run(self, waiting: deque[int]) -> bool:
        limit = inflight_limit(self.model)
        window_limit = settings.GENERATION_INFLIGHT_OUTPUT_BYTES
        silence_s = settings.TRITON_TIMEOUT_SECONDS
        stream = self.backend.generation_stream(self.model.triton_name, on_response=self.inbox.put)
        stopped, clean = False, False
        try:
            last_heard = time.monotonic()
            while waiting or self.running:
                if self.control.check():
                    stopped = True
                    self._drain()  # answers already here are finished lines: kept, not regenerated
                    break
                while waiting and len(self.running) < limit:
                    number = waiting[0]
                    request = self.request_of(self.lines[number])
                    size = line_output_bytes(request, expected_completion_tokens=None)
                    if self.running and self.window_bytes + size > window_limit:
                        break  # sent as lines out finish: their answers are read before more can arrive
                    waiting.popleft()
                    # The line number is unique in the shard, so it names the request on this stream.
                    request_id = str(number)
                    self.running[request_id] = number
                    self.output_bytes[request_id] = size
                    self.window_bytes += size
                    stream.submit(engine_request(request_id, request, model=self.model))
                try:
                    response = self.inbox.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    if time.monotonic() - last_heard > silence_s:
                        raise TransientTritonError(
                            f"no response from {self.model.triton_name} in {silence_s:.0f}s with "
                            f"{len(self.running)} lines in flight"
                        ) from None
                    continue
                last_heard = time.monotonic()
                self._receive(response)
            clean = not stopped
        finally:
            # Lines still out (a stop, a lease lost, an error) are cancelled in the engine, not left to run.
            stream.close(cancel=not clean)
        return stopped

    def _drain(self) -> None:
        while True:
            try:
                self._receive(self.inbox.get_nowait())
            except (queue.Empty, TransientTritonError):
                return  # stopping anyway: a broken server only ends the reading

    def _receive(self, response: GenerationResponse) -> None:
        number = self.running.get(response.request_id)
        if number is None:
            return  # not one of ours (the stream answers only what was submitted on it)
        if response.texts:
            self.last[response.request_id] = response
        if not response.final:
            return
        del self.running[response.request_id]
        self.window_bytes -= self.output_bytes.pop(response.request_id)
        answer = self.last.pop(response.request_id, response)
        error = response.error
        if isinstance(error, TransientTritonError):
            raise error  # the server, not the line: the shard is retried whole, free
        if isinstance(error, PermanentTritonError):
            self.control.finish(number, LineFailure(400, "invalid_request", error.message))
            return
        parsed = self.lines[number]
        try:
            result = engine_result(self.request_of(parsed), answer)
        except EngineAnswerError as exc:
            self.control.finish(number, LineFailure(500, "server_error", str(exc)))
            return
        pieces = {0: (result, self.control.request_id(number))}
        self.control.finish(number, self.render(parsed, pieces))
