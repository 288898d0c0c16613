"""Generation over one gRPC bidirectional stream (Triton's ModelStreamInfer): many requests in flight, each
answered by one or more responses, the last one flagged final, in whatever order they finish.

The interface is Triton's vLLM backend's (`text_input`, `sampling_parameters` JSON, `return_*` flags), which
triton_models/tinylm speaks too, so one call drives the CPU engine and vLLM alike.

The generated gRPC stub is used rather than tritonclient's `start_stream` because tritonclient drops the
response of an error (it passes the callback only the message), and with many requests on one stream a
per-line error is useless without the request id that the response carries. Part of triton/, the one package
that imports tritonclient; errors are classified by triton/errors.py like every other call.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, serialize_byte_tensor

from controlplane.triton.client import _CHANNEL_ARGS
from controlplane.triton.errors import TransientTritonError, TritonError, classify

# Optional outputs and the vLLM-backend flag that turns each on (num_cached_tokens is tinylm's own extra).
OUTPUT_FLAGS = {
    "finish_reason": "return_finish_reason",
    "cumulative_logprob": "return_cumulative_logprob",
    "logprobs": "return_logprobs",
    "num_input_tokens": "return_num_input_tokens",
    "num_output_tokens": "return_num_output_tokens",
    "num_cached_tokens": "return_num_cached_tokens",
}


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    prompt: str
    sampling_parameters: dict[str, Any]  # vLLM SamplingParams fields: max_tokens, temperature, n, stop, seed...
    outputs: tuple[str, ...] = ("finish_reason", "num_input_tokens", "num_output_tokens")
    stream: bool = False  # True: a response per step with the new text; False: one response with all of it
    # The prompt as the engine would tokenize it, for an engine that takes it (tinylm's `prompt_token_ids`): it
    # then skips its own tokenizer. The text is sent too (the vLLM interface requires it).
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass
class GenerationResponse:
    """One response; `final` on the last for its request. Per-choice lists are in choice order."""

    request_id: str
    final: bool
    texts: list[str] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    num_input_tokens: int | None = None
    num_output_tokens: list[int] | None = None
    num_cached_tokens: int | None = None
    cumulative_logprob: list[float] | None = None
    logprobs: list[Any] | None = None  # per choice: vLLM's list of {token_id: {logprob, rank, decoded_token}}
    error: TritonError | None = None  # final, for this request only


def _tensor(name: str, datatype: str, array: np.ndarray) -> tuple[Any, bytes]:
    # serialize_byte_tensor returns a 0-d array holding the length-prefixed bytes (as InferInput uses it).
    raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
    return service_pb2.ModelInferRequest().InferInputTensor(name=name, datatype=datatype, shape=list(array.shape)), raw


def _infer_request(model: str, request: GenerationRequest) -> Any:
    inputs = [
        _tensor("text_input", "BYTES", np.array([request.prompt.encode("utf-8")], dtype=np.object_)),
        _tensor(
            "sampling_parameters",
            "BYTES",
            np.array([json.dumps(request.sampling_parameters).encode()], dtype=np.object_),
        ),
        _tensor("stream", "BOOL", np.array([request.stream], dtype=bool)),
        _tensor("exclude_input_in_output", "BOOL", np.array([True], dtype=bool)),
    ]
    inputs += [_tensor(OUTPUT_FLAGS[name], "BOOL", np.array([True], dtype=bool)) for name in request.outputs]
    if request.prompt_token_ids is not None:
        inputs.append(_tensor("prompt_token_ids", "INT32", np.asarray(request.prompt_token_ids, dtype=np.int32)))
    message = service_pb2.ModelInferRequest(model_name=model, id=request.request_id)
    for tensor, raw in inputs:
        message.inputs.append(tensor)
        message.raw_input_contents.append(raw)
    # Triton marks the response that carries the final flag (or sends an empty one), so we know when a
    # request is done without knowing the model's response count.
    message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


def _decode(infer_response: Any) -> GenerationResponse:
    final = infer_response.parameters["triton_final_response"].bool_param
    response = GenerationResponse(request_id=infer_response.id, final=final)
    for tensor, raw in zip(infer_response.outputs, infer_response.raw_output_contents, strict=False):
        if tensor.datatype == "BYTES":
            values = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in deserialize_bytes_tensor(raw)]
        else:
            values = np.frombuffer(raw, dtype=np.uint32 if tensor.datatype == "UINT32" else np.float32).tolist()
        if tensor.name == "text_output":
            response.texts = values
        elif tensor.name == "finish_reason":
            response.finish_reasons = [None if v == "None" else v for v in values]
        elif tensor.name == "logprobs":
            response.logprobs = [json.loads(v) for v in values]
        elif tensor.name in ("num_input_tokens", "num_cached_tokens"):
            setattr(response, tensor.name, int(values[0]))
        elif tensor.name in ("num_output_tokens", "cumulative_logprob"):
            setattr(response, tensor.name, values)
    return response


class GenerationStream:
    """One ModelStreamInfer call to one server for one model. `submit` from any thread; responses arrive on
    `on_response` (called from the stream's reader thread) or, without a callback, through `responses()`.
    Once the call has ended (the server went away, even before anything was sent), every request in flight
    gets a final error and `submit` raises it: no request waits for an answer that cannot come.

    The KServe stream has no per-request cancel: `cancel(request_id)` forgets a request (its later responses
    are dropped); `close(cancel=True)` cancels the whole call, which Triton turns into `is_cancelled()` for
    every request still running on it, and the engine stops them within a step.
    """

    def __init__(
        self,
        url: str,
        model: str,
        *,
        on_response: Callable[[GenerationResponse], None] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.model = model
        self._channel = grpc.insecure_channel(url, options=_CHANNEL_ARGS)
        self._outbox: queue.Queue[Any] = queue.Queue()
        self._inbox: queue.Queue[GenerationResponse | None] = queue.Queue()
        self._on_response = on_response or self._inbox.put
        self._pending: set[str] = set()
        # Set when the call has ended: a request submitted after that would be answered by no one (the
        # reader that fails the pending ones is gone), so submit raises this instead.
        self._broken: TritonError | None = None
        self._lock = threading.Lock()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._call = stub.ModelStreamInfer(iter(self._outbox.get, None), timeout=timeout_s)
        self._reader = threading.Thread(target=self._read, name=f"triton-stream-{model}", daemon=True)
        self._reader.start()

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._pending)

    def submit(self, request: GenerationRequest) -> None:
        """Send one request; raises the stream's error if the call has already ended (a server that went
        away before this request was sent: it would never be answered)."""
        with self._lock:
            if self._broken is not None:
                raise type(self._broken)(self._broken.message, status=self._broken.status)
            if request.request_id in self._pending:
                raise ValueError(f"request id {request.request_id!r} is already in flight on this stream")
            self._pending.add(request.request_id)
        self._outbox.put(_infer_request(self.model, request))

    def cancel(self, request_id: str) -> None:
        with self._lock:
            self._pending.discard(request_id)

    def responses(self, *, timeout_s: float | None = None) -> Iterator[GenerationResponse]:
        """Responses as they come (only without `on_response`), until none is in flight; a silence longer than
        `timeout_s` raises TransientTritonError."""
        while self.in_flight or not self._inbox.empty():
            try:
                response = self._inbox.get(timeout=timeout_s)
            except queue.Empty:
                raise TransientTritonError(f"no response from {self.model} in {timeout_s}s") from None
            if response is not None:
                yield response

    def _deliver(self, response: GenerationResponse) -> None:
        with self._lock:
            if response.request_id not in self._pending:
                return  # cancelled by the caller, or the reply to a request of a broken stream already failed
        self._on_response(response)
        if response.final:
            # Only once it is handed over: `responses()` stops when nothing is in flight and its queue is empty,
            # so a final response dropped from `pending` before it was queued would be lost to it.
            with self._lock:
                self._pending.discard(response.request_id)

    def _read(self) -> None:
        try:
            for message in self._call:
                if message.error_message:
                    error = classify(InferenceServerException(msg=message.error_message))
                    request_id = message.infer_response.id
                    self._deliver(GenerationResponse(request_id=request_id, final=True, error=error))
                else:
                    self._deliver(_decode(message.infer_response))
        except grpc.RpcError as exc:
            error = classify(InferenceServerException(msg=exc.details() or str(exc), status=str(exc.code())))
            self._fail_all(error)
        else:
            self._fail_all(TransientTritonError("the generation stream ended with requests in flight"))

    def _fail_all(self, error: TritonError) -> None:
        """The stream broke (server gone, cancelled): every request still in flight gets a final error."""
        with self._lock:
            # Under the lock with the snapshot: a request is either in it (failed here) or refused by submit.
            self._broken = error
            pending = sorted(self._pending)
        for request_id in pending:
            self._deliver(GenerationResponse(request_id=request_id, final=True, error=error))
        self._inbox.put(None)  # wakes `responses()`

    def close(self, *, cancel: bool = False) -> None:
        """Stop sending. `cancel=True` aborts the call (Triton cancels what runs); otherwise wait for the
        requests in flight to finish first."""
        self._outbox.put(None)
        if cancel:
            self._call.cancel()
        self._reader.join(timeout=30)
        self._channel.close()

    def __enter__(self) -> GenerationStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close(cancel=exc_info[0] is not None)
