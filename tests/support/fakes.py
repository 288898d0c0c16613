"""A fake inference backend for fast unit tests of dispatch. Its real counterpart, TritonBackend
against a real tritonserver, is exercised by tests/e2e and tests/triton."""

from __future__ import annotations

import hashlib
import threading

import numpy as np

from controlplane.triton.client import PermanentTritonError, TransientTritonError


def fake_embedding(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    vector = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
    return vector / np.linalg.norm(vector)


class FakeBackend:
    """Embeds deterministically, echoes tensors. Texts containing ``REJECT`` make Triton-style
    permanent errors; ``transient_failures`` makes the next N calls fail as if the server were down."""

    server = "fake:0"
    instances: int | None = None  # not known: shards are split into DISPATCH_INFLIGHT_CALLS calls
    gpus = False

    def __init__(self, *, transient_failures: int = 0, on_call: object = None):
        self.transient_failures = transient_failures
        self.calls: list[dict[str, np.ndarray]] = []
        self.prepared: list[str] = []
        self.on_call = on_call
        self._lock = threading.Lock()

    def prepare(self, triton_model: str) -> None:
        self.prepared.append(triton_model)

    def infer(self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        with self._lock:
            self.calls.append(inputs)
            if self.transient_failures > 0:
                self.transient_failures -= 1
                raise TransientTritonError("fake: server unavailable")
        if callable(self.on_call):
            self.on_call(len(self.calls))
        if triton_model == "minilm":
            texts = [row[0].decode() for row in inputs["TEXT"]]
            if any("REJECT" in t for t in texts):
                raise PermanentTritonError("fake: model rejected the input")
            return {
                "EMBEDDING": np.stack([fake_embedding(t) for t in texts]),
                "TOKENS": np.array([[len(t.split()) + 2] for t in texts], dtype=np.int32),
            }
        return {"OUTPUT0": inputs["INPUT0"].copy()}
