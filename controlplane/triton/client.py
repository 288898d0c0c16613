"""The one adapter between the control plane and Triton: with triton/errors.py (how its failures are
classified), the only module that imports tritonclient.

Sync gRPC client. A gRPC channel multiplexes calls and is thread-safe, so one `TritonClient` per server
can serve several `infer` calls at once from a ThreadPoolExecutor, which keeps Triton's dynamic batcher
fed. Every failure surfaces as `TransientTritonError` (retry, maybe elsewhere) or `PermanentTritonError`
(the request itself is wrong: a per-line error for the tenant).
"""

from __future__ import annotations

import json
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

from controlplane.core.observability import metrics, tracing
from controlplane.triton.errors import (
    ModelNotLoadedError,
    PermanentTritonError,
    TransientTritonError,
    TritonError,
    classify,
    retry_transient,
)

T = TypeVar("T")

# The failure types live in triton/errors.py; callers import them from here, with the client.
__all__ = [
    "ModelNotLoadedError",
    "PermanentTritonError",
    "TransientTritonError",
    "TritonClient",
    "TritonError",
    "classify",
    "metrics_text",
    "repository_model_config",
    "retry_transient",
]


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
        first = next(iter(inputs.values()), None)
        rows = int(first.shape[0]) if first is not None and first.ndim else 1
        # A child span of the caller's (a shard's) whose W3C traceparent Triton continues (core/observability/tracing.py).
        with tracing.outgoing("triton.infer", attributes={"model": name, "server": self.url, "rows": rows}) as headers:
            started = time.monotonic()
            in_flight.inc()
            try:
                result = self._call(self._client.infer, name, tensors, outputs=requested, headers=headers)
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


def cpu_instances(config: dict[str, Any]) -> int:
    """A model config's KIND_CPU instance count (1 without one): what the fleet reconciler loads per placed
    instance on a CPU server (fleet/placement/reconciler.py), and what the benchmark's ceiling matches."""
    counts = [int(g.get("count", 1)) for g in config.get("instance_group", []) if g.get("kind") == "KIND_CPU"]
    return max(1, sum(counts)) if counts else 1
