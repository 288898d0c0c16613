"""Where a shard's Triton calls go (fleet routing). The batch pipeline sees only the kinds' Backend protocol; the
Triton adapter (controlplane.triton.client) is the one module that speaks to Triton.

- Managed fleet (servers registered): calls follow the placements, weighted by instances; a server that
  fails transiently is skipped for the rest of the shard and reported to its circuit breaker, so a shard
  whose server dies mid-way carries on elsewhere.
- Unmanaged (no servers registered, the embedded default): TRITON_GRPC_URLS, loading on first use."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from django.conf import settings

from controlplane.fleet.membership.inventory import breaker_record
from controlplane.fleet.placement.routing import pick_route, routes_for_model
from controlplane.fleet.selectors import fleet_is_managed
from controlplane.triton.client import TransientTritonError, TritonClient, retry_transient
from controlplane.triton.streaming import GenerationResponse, GenerationStream

# Per-call failover: try this many different placements before giving the shard back.
FAILOVER_ATTEMPTS = 4


class NoCapacity(TransientTritonError):
    """No ready placement of the model yet: the shard waits (unclaimed) for the reconciler."""


# TritonBackend and FleetBackend satisfy the kinds' Backend protocol (kinds/base.py) structurally: fleet sits
# below kinds in the layers, so it names no type of theirs.


_clients: dict[str, TritonClient] = {}
_clients_lock = threading.Lock()


def _client(url: str) -> TritonClient:
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = TritonClient(url, timeout_s=settings.TRITON_TIMEOUT_SECONDS)
        return client


class TritonBackend:
    """One fixed Triton server. Transient errors are retried with backoff and jitter; what escapes is
    either permanent (a per-line error) or a server that stayed down (the shard is released)."""

    def __init__(self, client: TritonClient, server: str):
        self.client = client
        self.server = server
        self.instances: int | None = None
        self.gpus = False  # not known: the embedded default and a CPU host run KIND_CPU instances
        self._loaded: set[str] = set()

    def prepare(self, triton_model: str) -> None:
        if triton_model not in self._loaded:
            retry_transient(lambda: self.client.ensure_loaded(triton_model))
            self._loaded.add(triton_model)

    def infer(self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        try:
            return retry_transient(lambda: self.client.infer(triton_model, inputs, output_names))
        except TransientTritonError:
            self._loaded.discard(triton_model)  # unloaded under us (restart)? check again next shard
            raise

    def generation_stream(
        self, triton_model: str, *, on_response: Callable[[GenerationResponse], None]
    ) -> GenerationStream:
        return GenerationStream(self.client.url, triton_model, on_response=on_response)


class FleetBackend:
    def __init__(self, triton_model: str):
        routes = routes_for_model(triton_model)
        if not routes:
            raise NoCapacity(f"model {triton_model!r} has no ready placement yet")
        self.server = ",".join(r.name for r in routes)
        self.instances: int | None = sum(r.weight for r in routes)
        self.gpus = any(r.real_gpus for r in routes)
        self._avoid: set[int] = set()
        self._lock = threading.Lock()

    def prepare(self, triton_model: str) -> None:
        return None  # placements are loaded by the reconciler before they become routable

    def infer(self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, np.ndarray]:
        last_error: TransientTritonError | None = None
        for attempt in range(FAILOVER_ATTEMPTS):
            routes = routes_for_model(triton_model, fresh=attempt > 0)
            with self._lock:
                route = pick_route(routes, exclude=self._avoid) or pick_route(routes)
            if route is None:
                raise NoCapacity(f"model {triton_model!r} lost its last placement") from last_error
            client = _client(route.grpc_url)
            try:
                outputs = retry_transient(partial(client.infer, triton_model, inputs, output_names), attempts=2)
            except TransientTritonError as exc:
                last_error = exc
                with self._lock:
                    self._avoid.add(route.server_id)
                breaker_record(server_id=route.server_id, ok=False)
                time.sleep(min(2.0, 0.25 * 2**attempt))
                continue
            return outputs
        raise last_error or TransientTritonError("no placement answered")

    def generation_stream(
        self, triton_model: str, *, on_response: Callable[[GenerationResponse], None]
    ) -> GenerationStream:
        """A stream to one placement, picked by weight. No failover inside it: a server lost mid-stream fails
        its lines transiently, and the shard is given back (free) and regenerated wherever it is claimed next."""
        route = pick_route(routes_for_model(triton_model))
        if route is None:
            raise NoCapacity(f"model {triton_model!r} lost its last placement")
        return GenerationStream(route.grpc_url, triton_model, on_response=on_response)


_round_robin = itertools.count()


def backend_for_model(triton_model: str) -> TritonBackend | FleetBackend:
    if fleet_is_managed():
        return FleetBackend(triton_model)
    urls = settings.TRITON_GRPC_URLS
    start = next(_round_robin)
    for offset in range(len(urls)):
        url = urls[(start + offset) % len(urls)]
        client = _client(url)
        if client.is_live():
            return TritonBackend(client, url)
    raise TransientTritonError(f"no Triton server is live among {urls}")
