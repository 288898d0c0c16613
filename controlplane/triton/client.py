"""The one adapter between the control plane and Triton: the only module that imports tritonclient.

Sync gRPC client. A gRPC channel multiplexes calls and is thread-safe, so one `TritonClient` per server
can serve several `infer` calls at once from a ThreadPoolExecutor, which keeps Triton's dynamic batcher
fed. Every failure surfaces as `TransientTritonError` (retry, maybe elsewhere) or `PermanentTritonError`
(the request itself is wrong: a per-line error for the tenant).
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from controlplane.metrics import registry as metrics

T = TypeVar("T")


class TritonError(Exception):
    """A Triton call failed. `status` is the gRPC status name (e.g. "UNAVAILABLE") when known."""

    def __init__(self, message: str, *, status: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class TransientTritonError(TritonError):
    """Worth retrying: server down or restarting, connection lost, deadline, queue full, not ready."""


class ModelNotLoadedError(TransientTritonError):
    """The server does not have the model loaded right now (never loaded, unloaded, or server restarted).

    Transient on purpose: in explicit mode this is a placement state, not a tenant error. Validation
    already rejected models missing from the catalogue, and a name absent from the model repository
    fails `load_model` with PermanentTritonError. Callers should `ensure_loaded` again or go elsewhere.
    """


class PermanentTritonError(TritonError):
    """Retrying cannot help: bad shape/dtype, unknown input, model code rejected the request, a model
    that cannot be loaded, anything unrecognised."""


_TRANSIENT_STATUSES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED"})
# Checked against the lower-cased message when the status alone is not conclusive (HTTP-style codes,
# client-side socket errors, or Triton reporting overload/restarts under a generic status).
_TRANSIENT_MESSAGES = (
    "connection refused",
    "connection reset",
    "failed to connect",
    "socket closed",
    "broken pipe",
    "deadline exceeded",
    "exceeds maximum queue size",
    "server is not ready",
    "server not ready",
    # The python backend restarts a crashed stub; the requests caught in the crash can be retried.
    "is not healthy",
)
# INTERNAL is what Triton reports both for its own failures and for an exception raised by a model's
# code; these markers are the server's (or the stub's) side, worth retrying elsewhere or later.
_INTERNAL_TRANSIENT_MESSAGES = (
    "out of memory",  # CUDA / ORT / TensorRT allocation failures
    "failed to allocate",
    "cuda error",
    "unavailable",
    "stub process",  # python backend: "Stub process '<m>' is not healthy", "... exited unexpectedly"
    "stub has exited",
    "failed to initialize stub",
    "shared memory",  # the python backend's shm pool ran out ("failed to increase the shared memory pool")
    "shutting down",
    "is not ready",
)
_HTTP_TRANSIENT = frozenset({"408", "429", "502", "503", "504"})


def _status_name(exc: InferenceServerException) -> str | None:
    raw = exc.status()
    if raw is None:
        return None
    # gRPC statuses arrive as "StatusCode.UNAVAILABLE"; the HTTP client uses "503".
    return str(raw).removeprefix("StatusCode.")


def classify(exc: BaseException) -> TritonError:
    """Map any exception raised while talking to Triton onto TransientTritonError / PermanentTritonError.

    Transient errors are infrastructure (retried, then the shard is released without spending an
    attempt); permanent ones are pinned to the line that caused them (a 400 line for the tenant).

    ==========================================  ==============================================  ==========
    status (gRPC name, or HTTP code)            message (lower-cased, substring)                 class
    ==========================================  ==============================================  ==========
    NOT_FOUND, or any                           "unknown model"                                  ModelNotLoaded (transient)
    UNAVAILABLE, DEADLINE_EXCEEDED,             any                                              transient
    RESOURCE_EXHAUSTED, ABORTED; 408 429 5xx*
    INTERNAL (or HTTP 500)                      "out of memory", "failed to allocate", "cuda      transient
                                                error", "unavailable", "stub process", "stub has
                                                exited", "failed to initialize stub", "shared
                                                memory", "shutting down", "is not ready"
    INTERNAL (or HTTP 500)                      anything else: the model's own exception on       permanent
                                                this request ("Failed to process the request(s)
                                                for model ..., message: ValueError: ...")
    any other status or none                    "connection refused/reset", "failed to connect",  transient
                                                "socket closed", "broken pipe", "deadline
                                                exceeded", "exceeds maximum queue size",
                                                "server (is) not ready", "is not healthy"
    INVALID_ARGUMENT, UNIMPLEMENTED, ...         anything else                                    permanent
    ConnectionError / TimeoutError (client)     -                                                transient
    any other exception                         -                                                permanent
    ==========================================  ==============================================  ==========

    (*) 502, 503, 504.
    """
    if isinstance(exc, TritonError):
        return exc
    if isinstance(exc, InferenceServerException):
        status = _status_name(exc)
        message = str(exc.message() or exc)
        lowered = message.lower()
        # "Request for unknown model: 'm' is not found" / "... has no available versions" (NOT_FOUND).
        if status == "NOT_FOUND" or "unknown model" in lowered:
            return ModelNotLoadedError(message, status=status)
        if status in _TRANSIENT_STATUSES or status in _HTTP_TRANSIENT:
            return TransientTritonError(message, status=status)
        if any(marker in lowered for marker in _TRANSIENT_MESSAGES):
            return TransientTritonError(message, status=status)
        if status in ("INTERNAL", "500") and any(marker in lowered for marker in _INTERNAL_TRANSIENT_MESSAGES):
            return TransientTritonError(message, status=status)
        return PermanentTritonError(message, status=status)
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return TransientTritonError(str(exc) or type(exc).__name__)
    return PermanentTritonError(f"{type(exc).__name__}: {exc}")


def retry_transient(
    fn: Callable[[], T],
    *,
    attempts: int = 4,
    base_delay_s: float = 0.2,
    max_delay_s: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn` until it succeeds; retry only TransientTritonError, up to `attempts` calls in all.

    Exponential backoff with full jitter (sleep uniform in [0, min(max, base * 2**n)]), so many workers
    hitting a restarting server do not come back in lockstep. The last error is re-raised.
    """
    if attempts < 1:
        raise ValueError("attempts must be >= 1")
    for attempt in range(attempts):
        try:
            return fn()
        except TransientTritonError:
            if attempt == attempts - 1:
                raise
            sleep(random.uniform(0.0, min(max_delay_s, base_delay_s * 2**attempt)))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class TensorSpec:
    """One model input/output. `datatype` uses KServe names ("FP32", "BYTES"...); dims exclude the batch dim."""

    name: str
    datatype: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class ModelInfo:
    """What packing needs to know about a model. `max_batch_size` 0 means the model does not batch."""

    name: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def _kserve_datatype(config_type: str) -> str:
    # Model configs say TYPE_FP32 / TYPE_STRING; the KServe protocol says FP32 / BYTES.
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _tensor_specs(entries: list[dict[str, Any]]) -> tuple[TensorSpec, ...]:
    # int64 fields come back from protobuf JSON as strings.
    return tuple(
        TensorSpec(
            name=str(entry["name"]),
            datatype=_kserve_datatype(str(entry.get("data_type", "TYPE_INVALID"))),
            dims=tuple(int(d) for d in entry.get("dims", [])),
        )
        for entry in entries
    )


def _infer_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    if array.dtype.kind == "U":
        # str arrays have no Triton dtype; BYTES tensors carry UTF-8 in object arrays.
        array = np.array([s.encode("utf-8") for s in array.reshape(-1)], dtype=np.object_).reshape(array.shape)
    datatype = np_to_triton_dtype(array.dtype)
    if datatype is None:
        raise PermanentTritonError(f"input {name!r}: numpy dtype {array.dtype} has no Triton datatype")
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


_MAX_MESSAGE_BYTES = 2**31 - 1
# tritonclient's own channel options (message sizes, keepalive defaults), plus a bound on gRPC's reconnect
# backoff. Without it a channel that saw the server down backs off exponentially (1 s x 1.6 per try, up to
# 120 s) and fails calls at once meanwhile; gRPC shares that state between all channels to one address in
# the process, so even a fresh client waits. A restarted Triton then looked down for up to a minute after
# its models were loaded again, and the failures opened its circuit breaker (tests/chaos measured 32 s).
_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 2**31 - 1),
    ("grpc.keepalive_timeout_ms", 20000),
    ("grpc.keepalive_permit_without_calls", False),
    ("grpc.http2.max_pings_without_data", 2),
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class TritonClient:
    """Synchronous gRPC client for one Triton server (`url` = "host:port" of its gRPC endpoint)."""

    def __init__(self, url: str, *, timeout_s: float = 60.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._client = grpcclient.InferenceServerClient(url=url, verbose=False, channel_args=_CHANNEL_ARGS)
        self._model_info: dict[str, ModelInfo] = {}
        self._lock = threading.Lock()

    def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, client_timeout=self.timeout_s, **kwargs)
        except Exception as exc:  # everything is classified, nothing is swallowed
            raise classify(exc) from exc

    def is_live(self) -> bool:
        """False when the server cannot be reached (never raises for that)."""
        try:
            return bool(self._call(self._client.is_server_live))
        except TritonError:
            return False

    def is_ready(self) -> bool:
        """False when the server cannot be reached or is not ready (never raises for that)."""
        try:
            return bool(self._call(self._client.is_server_ready))
        except TritonError:
            return False

    def is_model_ready(self, name: str) -> bool:
        """False for an unknown, unloaded or still-loading model, or an unreachable server."""
        try:
            return bool(self._call(self._client.is_model_ready, name))
        except TritonError:
            return False

    def load_model(self, name: str, *, config: dict[str, Any] | None = None) -> None:
        """Load or reload `name` (explicit model-control mode); blocks until loaded or failed.

        `config` replaces config.pbtxt for this load; it is not merged. To change one field (instance
        count, GPU ids) start from `model_config(name)`. A reload keeps serving the old instances until the
        new ones are ready, so in-flight traffic does not fail.
        """
        payload = json.dumps(config) if config is not None else None
        try:
            self._call(self._client.load_model, name, config=payload)
        finally:
            with self._lock:
                self._model_info.pop(name, None)

    def unload_model(self, name: str) -> None:
        """Unload `name`; in-flight requests finish first."""
        try:
            self._call(self._client.unload_model, name)
        finally:
            with self._lock:
                self._model_info.pop(name, None)

    def ensure_loaded(self, name: str) -> None:
        """Load `name` unless it is already ready."""
        if not self.is_model_ready(name):
            self.load_model(name)

    def repository_index(self) -> list[dict[str, Any]]:
        """Models in the server's repository with their `state` ("READY", "UNAVAILABLE", absent if never
        loaded): what the reconciler compares with the placements it wants."""
        response = self._call(self._client.get_model_repository_index, as_json=True)
        return list(response.get("models", []))

    def model_config(self, name: str) -> dict[str, Any]:
        """The loaded model's full config as protobuf JSON (int64 fields are strings), usable as `config=`."""
        response = self._call(self._client.get_model_config, name, as_json=True)
        return dict(response["config"])

    def model_info(self, name: str) -> ModelInfo:
        """Batch size and tensor specs of a loaded model; cached until this client (re)loads or unloads it."""
        with self._lock:
            cached = self._model_info.get(name)
        if cached is not None:
            return cached
        config = self.model_config(name)
        info = ModelInfo(
            name=name,
            # Protobuf JSON omits zero values: no max_batch_size key means the model does not batch.
            max_batch_size=int(config.get("max_batch_size", 0)),
            inputs=_tensor_specs(config.get("input", [])),
            outputs=_tensor_specs(config.get("output", [])),
        )
        with self._lock:
            self._model_info[name] = info
        return info

    def infer(self, name: str, inputs: Mapping[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        """Run one inference call. Arrays include the batch dim; BYTES are numpy object arrays of bytes.

        Raises TransientTritonError or PermanentTritonError; `timeout_s` bounds the whole call.
        """
        try:
            tensors = [_infer_input(input_name, array) for input_name, array in inputs.items()]
        except InferenceServerException as exc:
            raise classify(exc) from exc
        requested = [grpcclient.InferRequestedOutput(output_name) for output_name in output_names]
        in_flight = metrics.TRITON_CALLS_IN_FLIGHT.labels(server=self.url)
        started = time.monotonic()
        in_flight.inc()
        try:
            result = self._call(self._client.infer, name, tensors, outputs=requested)
        finally:
            in_flight.dec()
            metrics.TRITON_CALL_DURATION.labels(model=name, server=self.url).observe(time.monotonic() - started)
        outputs: dict[str, np.ndarray] = {}
        for output_name in output_names:
            array = result.as_numpy(output_name)
            if array is None:
                raise PermanentTritonError(f"model {name!r} returned no output {output_name!r}")
            outputs[output_name] = array
        return outputs

    def model_statistics(self, name: str) -> dict[str, Any]:
        """Raw inference statistics (counts, queue/compute nanoseconds) as Triton's JSON."""
        return dict(self._call(self._client.get_inference_statistics, model_name=name, as_json=True))

    def model_compute_ns(self, name: str) -> int:
        """Cumulative compute time (input + infer + output nanoseconds, all versions, all callers) of one
        model on this server since it was loaded: the usage ledger attributes its growth (usage/attribution.py)."""
        stats = self.model_statistics(name)
        return sum(
            int(entry.get("inference_stats", {}).get(part, {}).get("ns", 0) or 0)
            for entry in stats.get("model_stats", [])
            for part in ("compute_input", "compute_infer", "compute_output")
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def metrics_text(url: str, *, timeout_s: float) -> str:
    """Triton's Prometheus text from its metrics URL; OSError (URLError, a timeout) when it does not answer.
    Only http(s) is opened: the URL comes from a server's registration, and urllib would also read file://
    and ftp:// URLs."""
    if not url.startswith(("http://", "https://")):
        raise urllib.error.URLError(f"not an http(s) URL: {url[:100]!r}")
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read().decode())


def repository_model_config(model_repository: str | Path, name: str) -> dict[str, Any]:
    """A model's config.pbtxt from a repository as the JSON that `load_model(config=...)` accepts: the
    reconciler starts from it and changes only `instance_group`."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    path = Path(model_repository) / name / "config.pbtxt"
    try:
        message = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except (OSError, text_format.ParseError) as exc:
        raise PermanentTritonError(f"cannot read the config of {name!r} at {path}: {exc}") from exc
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
