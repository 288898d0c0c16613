"""CallClock (scheduling/call_clock.py): the time a shard had a Triton call in flight, overlapping calls once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from controlplane.scheduling.call_clock import CallClock


class _Backend:
    server, instances, gpus = "t0", 2, False

    def __init__(self, seconds: float = 0.05, fail: bool = False) -> None:
        self.seconds, self.fail, self.prepared = seconds, fail, []

    def prepare(self, triton_model: str) -> None:
        self.prepared.append(triton_model)

    def infer(self, triton_model, inputs, output_names):
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("server went away")
        return {"OUT": inputs["IN"]}

    def generation_stream(self, triton_model, *, on_response):
        return "stream"


def _call(clock: CallClock) -> None:
    clock.infer("identity", {"IN": np.zeros(1)}, ["OUT"])


def test_sequential_calls_add_up_and_the_answer_passes_through():
    clock = CallClock(_Backend(0.05))
    assert clock.model_seconds is None  # nothing timed yet
    assert clock.infer("identity", {"IN": np.ones(2)}, ["OUT"])["OUT"].tolist() == [1.0, 1.0]
    _call(clock)
    assert 0.1 <= clock.model_seconds < 0.1 + 0.5
    assert (clock.server, clock.instances) == ("t0", 2)


def test_overlapping_calls_from_the_shards_threads_count_once():
    clock = CallClock(_Backend(0.2))
    threads = [threading.Thread(target=_call, args=(clock,)) for _ in range(3)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    assert 0.2 <= clock.model_seconds <= wall  # three 0.2 s calls at once: the union, not 0.6 s


def test_a_failed_call_still_ends_and_a_stream_is_not_timed():
    clock = CallClock(_Backend(0.01, fail=True))
    with pytest.raises(RuntimeError):
        _call(clock)
    assert clock.model_seconds >= 0.01
    clock.prepare("identity")
    assert clock._backend.prepared == ["identity"]
    assert clock.generation_stream("tinylm", on_response=print) == "stream"
    assert clock.model_seconds is None  # a generation shard is sized by its kind's own rule
