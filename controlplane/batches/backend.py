"""Where a shard's Triton calls go. The batches app sees only this small interface; the Triton adapter
(controlplane.triton.client) is the one module that speaks to Triton."""

from __future__ import annotations

import itertools
import threading
from typing import Protocol

import numpy as np
from django.conf import settings

from controlplane.triton.client import TransientTritonError, TritonClient, retry_transient


class InferenceBackend(Protocol):
    server: str

    def prepare(self, triton_model: str) -> None: ...

    def infer(
        self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]
    ) -> dict[str, np.ndarray]: ...


class TritonBackend:
    """One Triton server. Transient errors are retried here with backoff and jitter; what escapes is
    either permanent (a per-line error) or a server that stayed down (the shard is released)."""

    def __init__(self, client: TritonClient, server: str):
        self.client = client
        self.server = server
        self._loaded: set[str] = set()

    def prepare(self, triton_model: str) -> None:
        if triton_model not in self._loaded:
            retry_transient(lambda: self.client.ensure_loaded(triton_model))
            self._loaded.add(triton_model)

    def infer(
        self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]
    ) -> dict[str, np.ndarray]:
        try:
            return retry_transient(lambda: self.client.infer(triton_model, inputs, output_names))
        except TransientTritonError:
            # The model may have been unloaded under us (server restart): check again next shard.
            self._loaded.discard(triton_model)
            raise


_clients: dict[str, TritonBackend] = {}
_lock = threading.Lock()
_round_robin = itertools.count()


def backend_for_shard() -> InferenceBackend:
    """Spread shards over the configured servers, skipping ones that do not answer."""
    urls = settings.TRITON_GRPC_URLS
    start = next(_round_robin)
    for offset in range(len(urls)):
        url = urls[(start + offset) % len(urls)]
        with _lock:
            backend = _clients.get(url)
            if backend is None:
                backend = _clients[url] = TritonBackend(
                    TritonClient(url, timeout_s=settings.TRITON_TIMEOUT_SECONDS), url
                )
        if backend.client.is_live():
            return backend
    raise TransientTritonError(f"no Triton server is live among {urls}")
