"""The tuner's load on a decoupled generation engine: requests kept in flight on one gRPC stream.

The control plane keeps 2 x MAX_NUM_SEQS generation requests in flight per placed instance, so that the
engine always has the next sequences queued when some finish; the load here does the same. Each request asks
for `max_tokens` tokens greedily (temperature 0, so a candidate's tokens do not depend on chance) and for
`num_output_tokens`, whole (stream false): completion tokens/s counts those of the requests that finished
inside the measured window, p95 is over their latencies (sent to final response).
"""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from build_engines.tune_search import Measurement

# Completions a measurement waits for at least, as tune_measure.MIN_CALLS: fewer make a noisy figure.
MIN_REQUESTS = 24
# Short prompts of varied length: well inside a small model's context with max_tokens on top.
SYNTHETIC_PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "Write a short note to a friend about the weather today.",
    "List three things a batch inference service must do well:",
    "In one sentence, explain why caching helps.",
    "The quick brown fox jumps over the lazy dog, and then",
    "Q: What is two plus two?\nA:",
    "Summarise: the meeting moved to Tuesday because the room was booked on Monday.",
)


@dataclass(frozen=True)
class GenerationLoad:
    in_flight: int | None  # requests in flight; None: 2 x the candidate's MAX_NUM_SEQS, as the control plane
    max_tokens: int
    warmup_s: float
    measure_s: float


def _request(prompt: str, max_tokens: int) -> list[Any]:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: object, datatype: str) -> Any:
        array = np.array([value], dtype=np.object_ if datatype == "BYTES" else np.bool_)
        infer_input = grpcclient.InferInput(name, [1], datatype)
        infer_input.set_data_from_numpy(array)
        return infer_input

    sampling = json.dumps({"max_tokens": max_tokens, "temperature": 0})
    return [
        tensor("text_input", prompt.encode(), "BYTES"),
        tensor("sampling_parameters", sampling.encode(), "BYTES"),
        tensor("stream", False, "BOOL"),
        tensor("return_num_output_tokens", True, "BOOL"),
    ]


def offer_generation_load(
    url: str,
    name: str,
    prompts: list[str],
    load: GenerationLoad,
    in_flight: int,
    clock: Callable[[], float] = time.monotonic,
) -> Measurement:
    """``in_flight`` requests on one stream: ``warmup_s``, then at least ``measure_s`` and ``MIN_REQUESTS``
    completions (at most 5 x ``measure_s``). Tokens/s is measured between the window's first and last
    completion, as tune_measure.offer_load measures rows/s.

    One stream with a callback rather than a client thread per request: the load is a hundred and more
    requests in flight (2 x MAX_NUM_SEQS), which as threads would compete with the engine for the cores it is
    measured on; the callback only queues each completion, and this thread sends the next request."""
    import tritonclient.grpc as grpcclient

    calls = [_request(prompt, load.max_tokens) for prompt in prompts]
    finished: queue.Queue[tuple[str, float, int, str]] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        now = clock()
        if error is not None:
            finished.put(("", now, 0, str(error).strip().splitlines()[0][:300] if str(error).strip() else "error"))
            return
        tokens = result.as_numpy("num_output_tokens")
        finished.put((result.get_response().id, now, int(tokens.sum()) if tokens is not None else 0, ""))

    client = grpcclient.InferenceServerClient(url)
    sent: dict[str, float] = {}
    window: list[tuple[float, float, int]] = []  # (finished, latency, tokens) after the warm-up
    error = ""
    counter = 0

    def send() -> None:
        nonlocal counter
        request_id = str(counter)
        sent[request_id] = clock()
        client.async_stream_infer(name, calls[counter % len(calls)], request_id=request_id)
        counter += 1

    try:
        client.start_stream(callback=callback, stream_timeout=None)
        opened = clock() + load.warmup_s
        least, most = opened + load.measure_s, opened + 5 * load.measure_s
        for _ in range(in_flight):
            send()
        while True:
            now = clock()
            if now >= most or (now >= least and len(window) >= MIN_REQUESTS):
                break
            try:
                request_id, at, tokens, failure = finished.get(timeout=max(0.01, most - now))
            except queue.Empty:
                continue
            if failure:
                error = failure
                break
            started = sent.pop(request_id, at)
            if at >= opened:
                window.append((at, at - started, tokens))
            send()
    finally:
        # The requests still running are cancelled: the next candidate's load starts on an idle engine.
        try:
            client.stop_stream(cancel_requests=True)
        finally:
            client.close()
    if error:
        return Measurement(0.0, 0.0, error=error)
    if not window:
        return Measurement(0.0, 0.0, error=f"no request finished within {5 * load.measure_s:g} s")
    window.sort()
    p95_ms = float(np.percentile([latency for _, latency, _ in window], 95)) * 1e3
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return Measurement(sum(t for _, _, t in window) / (window[-1][0] - opened + 1e-9), p95_ms)
    tokens = sum(t for _, _, t in window[1:])
    return Measurement(tokens / (window[-1][0] - window[0][0]), p95_ms)
