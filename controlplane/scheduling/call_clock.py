"""The model time of one shard: how long at least one of its Triton calls was in flight (scheduling/runner.py
wraps the shard's backend in a CallClock, and shard_settle folds the result into the sizing estimate).

A shard's cycle (claim, reading its input, the calls, writing its part, commit) has costs that do not grow with
its lines. Shards sized from the whole cycle shrink whenever those costs grow (a loaded host, a slow database):
a smaller shard pays the same fixed cost over fewer lines, measures slower per line, and is cut smaller again,
down to SCHEDULER_SHARD_MIN_LINES, where the fixed cost is paid every few lines and keeps the host loaded (a hog
run: 50-line shards became 4-line shards after a Postgres restart and every later chaos batch ran out of time;
docs/reliability.md). The calls' own time grows with the lines, so shards cut by it stay large."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from controlplane.kinds.base import Backend

if TYPE_CHECKING:
    from controlplane.triton.streaming import GenerationResponse, GenerationStream


class CallClock:
    """A Backend that passes every call on and measures the wall time during which any ``infer`` call was in
    flight (overlapping calls from the shard's threads count once). A generation stream is passed on untimed:
    ``model_seconds`` is then None (its kind sizes shards by its own rule, kinds/generation/kind.py)."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self.server = backend.server
        self.instances = backend.instances
        self.gpus = backend.gpus
        self._lock = threading.Lock()
        self._in_flight = 0
        self._busy_since = 0.0
        self._busy = 0.0
        self._streamed = False

    @property
    def model_seconds(self) -> float | None:
        """Seconds with a call in flight, once the calls have returned; None when nothing was timed."""
        with self._lock:
            if self._streamed or self._in_flight or self._busy <= 0:
                return None
            return self._busy

    def prepare(self, triton_model: str) -> None:
        self._backend.prepare(triton_model)

    def infer(self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        self._call_started()
        try:
            return self._backend.infer(triton_model, inputs, output_names)
        finally:
            self._call_ended()

    def generation_stream(
        self, triton_model: str, *, on_response: Callable[[GenerationResponse], None]
    ) -> GenerationStream:
        with self._lock:
            self._streamed = True
        return self._backend.generation_stream(triton_model, on_response=on_response)

    def _call_started(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._busy_since = time.monotonic()
            self._in_flight += 1

    def _call_ended(self) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._busy += time.monotonic() - self._busy_since
