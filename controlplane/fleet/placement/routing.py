"""Which server a shard's calls go to: servers holding a ready placement of the model, weighted by
instances, skipping draining/unhealthy servers and open circuit breakers."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from django.db.models import Sum
from django.utils import timezone

from controlplane.fleet.models import Placement, PlacementStatus
from controlplane.fleet.selectors import ROUTABLE_STATES

# Routes are read from Postgres at most this often per process: fresh enough to follow a rebalance
# within a beat interval, rare enough that dispatch is not a database load.
ROUTE_CACHE_SECONDS = 1.0


@dataclass(frozen=True)
class Route:
    server_id: int
    name: str
    grpc_url: str
    weight: int
    real_gpus: bool = False  # KIND_GPU instances (TritonServer.real_gpus)


_cache: dict[str, tuple[float, list[Route]]] = {}
_lock = threading.Lock()


def routes_for_model(triton_name: str, *, fresh: bool = False) -> list[Route]:
    now = time.monotonic()
    with _lock:
        cached = _cache.get(triton_name)
    if cached and not fresh and now - cached[0] < ROUTE_CACHE_SECONDS:
        return cached[1]
    rows = (
        Placement.objects.filter(
            model__triton_name=triton_name,
            status=PlacementStatus.READY,
            instances__gt=0,
            server__state__in=ROUTABLE_STATES,
        )
        .exclude(server__breaker_open_until__gt=timezone.now())
        .values("server_id", "server__name", "server__grpc_url", "server__real_gpus")
        .annotate(weight=Sum("instances"))
        .order_by("server__name")
    )
    routes = [
        Route(r["server_id"], r["server__name"], r["server__grpc_url"], int(r["weight"]), r["server__real_gpus"])
        for r in rows
    ]
    with _lock:
        _cache[triton_name] = (now, routes)
    return routes


def pick_route(
    routes: list[Route], *, exclude: AbstractSet[int] = frozenset(), rng: random.Random | None = None
) -> Route | None:
    candidates = [r for r in routes if r.server_id not in exclude]
    if not candidates:
        return None
    chooser = rng or random
    return chooser.choices(candidates, weights=[r.weight for r in candidates], k=1)[0]
