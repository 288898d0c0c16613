"""How a failed Triton call is classified: TransientTritonError (retry, maybe elsewhere) or
PermanentTritonError (the request itself is wrong: a per-line error for the tenant), and the retry of the
transient ones. The client (triton/client.py) raises only these."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from tritonclient.utils import InferenceServerException

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
