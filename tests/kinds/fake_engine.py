"""A fake generation engine behind a fake GenerationStream, for fast tests of the generation kinds' run.

It answers tinylm's grammar ("count from a to b" → "a … b", stop at the end, length at max_tokens) in the
shapes Triton's vLLM backend uses (one element per choice, vLLM's logprobs JSON, sampled token first). Its
real counterpart: tests/kinds/test_generation_batch.py runs the same kinds against tinylm on a real
tritonserver through the production shard path."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from controlplane.triton.errors import PermanentTritonError, TransientTritonError
from controlplane.triton.streaming import GenerationRequest, GenerationResponse

_COUNT = re.compile(r"count from (\d+) to (\d+)")


def answer(request: GenerationRequest) -> GenerationResponse:
    """The engine's final response to ``request`` (a permanent error for a prompt that says REJECT)."""
    if "REJECT" in request.prompt:
        error = PermanentTritonError("sampling_parameters: the engine refused this request")
        return GenerationResponse(request.request_id, final=True, error=error)
    params = request.sampling_parameters
    found = _COUNT.search(request.prompt)
    words = [str(v) for v in range(int(found[1]), int(found[2]) + 1)] if found else ["ok"]
    limit = params.get("max_tokens", 16)
    # The EOS is a generated token too: it fits only if the words leave room for it (as in the engines).
    generated, reason = (words[:limit], "length") if len(words) >= limit else (words, "stop")
    n = params.get("n", 1)
    response = GenerationResponse(
        request.request_id,
        final=True,
        texts=[" ".join(generated)] * n,
        finish_reasons=[reason] * n,
        num_input_tokens=len(request.prompt.split()),
        num_output_tokens=[len(generated) + (reason == "stop")] * n,  # the EOS counts, as in vLLM
    )
    if "num_cached_tokens" in request.outputs:
        response.num_cached_tokens = 0
    if "logprobs" in request.outputs:
        k = params["logprobs"]
        tokens = [*generated, "<eos>"] if reason == "stop" else generated
        per_token = [_entry(position, token, k) for position, token in enumerate(tokens)]
        response.logprobs = [per_token] * n
    return response


def _entry(position: int, token: str, k: int) -> dict[str, Any]:
    """vLLM's entry for one position: the sampled token first, then the top-k (here it ranks 2nd, so the
    alternatives are seen to be ordered by rank, not by insertion)."""
    entry = {str(100 + position): {"logprob": -0.5, "rank": 2, "decoded_token": token}}
    for rank in (1, *range(3, k + 1)):
        entry[str(200 + rank)] = {"logprob": -0.1 * rank, "rank": rank, "decoded_token": f"alt{rank}"}
    return entry


class FakeStream:
    """GenerationStream's interface: ``submit`` answers at once unless the prompt contains HOLD (then it waits
    for ``release``); ``transient_after`` breaks the stream after that many submissions."""

    def __init__(self, engine: FakeEngine, on_response: Callable[[GenerationResponse], None]) -> None:
        self.engine, self.on_response = engine, on_response
        self.held: list[GenerationRequest] = []
        self.closed: bool | None = None  # None: open; else whether it was closed with cancel

    def submit(self, request: GenerationRequest) -> None:
        assert self.closed is None, "submitted on a closed stream"
        engine = self.engine
        with engine.lock:
            engine.submitted.append(request)
            engine.outstanding += 1
            engine.max_outstanding = max(engine.max_outstanding, engine.outstanding)
            broken = engine.transient_after is not None and len(engine.submitted) > engine.transient_after
        if broken:
            self._deliver(GenerationResponse(request.request_id, True, error=TransientTritonError("stream broke")))
        elif "HOLD" in request.prompt:
            self.held.append(request)
        else:
            self._deliver(answer(request))
        if engine.on_submit is not None:
            engine.on_submit(self, request)

    def release(self) -> None:
        held, self.held = self.held, []
        for request in held:
            self._deliver(answer(request))

    def _deliver(self, response: GenerationResponse) -> None:
        with self.engine.lock:
            self.engine.outstanding -= 1
        self.on_response(response)

    def close(self, *, cancel: bool = False) -> None:
        self.closed = cancel


class FakeEngine:
    """Stands in for the backend's side: ``generation_stream`` opens a FakeStream and records it."""

    server = "fake-engine:0"
    instances = 1
    gpus = False

    def __init__(self, *, transient_after: int | None = None) -> None:
        self.lock = threading.Lock()
        self.submitted: list[GenerationRequest] = []
        self.streams: list[FakeStream] = []
        self.outstanding = self.max_outstanding = 0
        self.transient_after = transient_after
        self.on_submit: Callable[[FakeStream, GenerationRequest], None] | None = None

    def prepare(self, triton_model: str) -> None:
        return None

    def infer(self, *args: Any) -> Any:
        raise AssertionError("a generation kind makes no request/response calls")

    def generation_stream(self, triton_model: str, *, on_response: Callable[[GenerationResponse], None]) -> FakeStream:
        stream = FakeStream(self, on_response)
        self.streams.append(stream)
        return stream
