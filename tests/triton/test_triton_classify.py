"""Error classification and retry policy: pure unit tests, no server."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from controlplane.triton.client import (
    ModelNotLoadedError,
    PermanentTritonError,
    TransientTritonError,
    TritonError,
    classify,
    retry_transient,
)


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("StatusCode.UNAVAILABLE", "failed to connect to all addresses; Connection refused"),
        ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size"),
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded"),
        ("StatusCode.RESOURCE_EXHAUSTED", "queue is full"),
        ("StatusCode.INTERNAL", "Stub process 'minilm_0_0' is not healthy."),
        # INTERNAL from the server's side (memory, a crashed or restarting stub, shutdown): infrastructure.
        ("StatusCode.INTERNAL", "onnx runtime error 6: CUDA failure 2: out of memory"),
        ("StatusCode.INTERNAL", "Failed to allocate memory for requested buffer of size 1048576"),
        ("StatusCode.INTERNAL", "Failed to process the request(s) for model 'minilm', message: Stub process exited"),
        ("StatusCode.INTERNAL", "Failed to increase the shared memory pool size for key 'triton_python_backend_shm'"),
        ("StatusCode.INTERNAL", "Server is shutting down"),
        ("StatusCode.INTERNAL", "model 'minilm' is unavailable"),
        ("500", "CUDA error: an illegal memory access was encountered"),
        (None, "Connection reset by peer"),
        ("503", "Server not ready"),
    ],
)
def test_transient(status: str | None, message: str) -> None:
    error = classify(InferenceServerException(msg=message, status=status))
    assert isinstance(error, TransientTritonError)
    assert error.message == message


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("StatusCode.INVALID_ARGUMENT", "inference input 'INPUT0' data-type is 'FP64', but model expects 'FP32'"),
        ("StatusCode.INVALID_ARGUMENT", "unexpected inference input 'NOPE' for model 'identity'"),
        ("StatusCode.INTERNAL", "failed to load 'nope', failed to poll from model repository"),
        # The model's own exception on one request: that request's error, not the server's.
        (
            "StatusCode.INTERNAL",
            "Failed to process the request(s) for model 'minilm_0_0', message: ValueError: bad token id",
        ),
        ("StatusCode.INTERNAL", "ZeroDivisionError: division by zero"),
        ("StatusCode.UNKNOWN", "something nobody anticipated"),
        (None, "got unexpected datatype float64 from numpy array"),
        ("400", "bad request"),
    ],
)
def test_permanent(status: str | None, message: str) -> None:
    assert isinstance(classify(InferenceServerException(msg=message, status=status)), PermanentTritonError)


def test_unloaded_model_is_transient_model_not_loaded() -> None:
    for message in (
        "Request for unknown model: 'm' is not found",
        "Request for unknown model: 'm' has no available versions",
    ):
        error = classify(InferenceServerException(msg=message, status="StatusCode.NOT_FOUND"))
        assert isinstance(error, ModelNotLoadedError)
        assert isinstance(error, TransientTritonError)
        assert error.status == "NOT_FOUND"


def test_non_triton_exceptions() -> None:
    assert isinstance(classify(ConnectionResetError("reset")), TransientTritonError)
    assert isinstance(classify(TimeoutError()), TransientTritonError)
    assert isinstance(classify(ValueError("bad")), PermanentTritonError)
    already = PermanentTritonError("x")
    assert classify(already) is already


class FlakyCall:
    def __init__(self, failures: list[TritonError]) -> None:
        self.failures = failures
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "ok"


def test_retry_transient_retries_with_bounded_jittered_backoff() -> None:
    sleeps: list[float] = []
    fn = FlakyCall([TransientTritonError("a"), TransientTritonError("b"), TransientTritonError("c")])
    assert retry_transient(fn, attempts=4, base_delay_s=0.5, max_delay_s=1.0, sleep=sleeps.append) == "ok"
    assert fn.calls == 4
    assert len(sleeps) == 3
    for attempt, slept in enumerate(sleeps):
        assert 0.0 <= slept <= min(1.0, 0.5 * 2**attempt)


def test_retry_transient_gives_up_after_attempts() -> None:
    fn = FlakyCall([TransientTritonError(str(i)) for i in range(10)])
    with pytest.raises(TransientTritonError, match="2"):
        retry_transient(fn, attempts=3, sleep=lambda _: None)
    assert fn.calls == 3


def test_retry_transient_does_not_retry_permanent() -> None:
    fn = FlakyCall([PermanentTritonError("bad shape")])
    with pytest.raises(PermanentTritonError):
        retry_transient(fn, sleep=lambda _: pytest.fail("must not sleep"))
    assert fn.calls == 1
