"""Fleet inventory: registering Triton servers and their GPUs, and the heartbeat that keeps health
current. On GPU hosts memory comes from Triton's own /metrics; on CPU hosts GPUs are declared."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.fleet.membership.gpu_metrics import parse_gpu_metrics
from controlplane.fleet.models import Gpu, Placement, PlacementEvent, PlacementStatus, ServerState, TritonServer
from controlplane.fleet.selectors import placed_bytes_per_gpu
from controlplane.triton.client import TritonClient, TritonError, metrics_text

logger = logging.getLogger(__name__)

# Two missed heartbeats in a row mark a server unhealthy: one can be a GC pause, two is an outage.
UNHEALTHY_AFTER_FAILURES = 2


@transaction.atomic
def server_register(
    *, name: str, grpc_url: str, gpu_memory_bytes: list[int], metrics_url: str = "", real_gpus: bool = False
) -> TritonServer:
    """Create or update a server and its declared GPUs (index i gets gpu_memory_bytes[i])."""
    server, _ = TritonServer.objects.update_or_create(
        name=name, defaults={"grpc_url": grpc_url, "metrics_url": metrics_url, "real_gpus": real_gpus}
    )
    for index, total in enumerate(gpu_memory_bytes):
        Gpu.objects.update_or_create(server=server, index=index, defaults={"total_memory_bytes": total})
    server.gpus.filter(index__gte=len(gpu_memory_bytes)).delete()
    return server


def server_set_operator_state(*, server: TritonServer, state: str | None, actor: str) -> None:
    """Drain or cordon a server (or clear it with None); the planner does the rest on its next run."""
    with transaction.atomic():
        effective = state or (
            ServerState.UNHEALTHY if server.missed_heartbeats >= UNHEALTHY_AFTER_FAILURES else ServerState.HEALTHY
        )
        TritonServer.objects.filter(id=server.id).update(operator_state=state, state=effective)
        PlacementEvent.objects.create(
            server=server,
            action=f"server_{state or 'uncordon'}",
            actor=actor,
            reason=f"operator set {state or 'normal scheduling'}",
        )


# Three seconds: Triton answers /metrics from memory; a slower answer means the server is in trouble.
METRICS_TIMEOUT_SECONDS = 3.0


def metrics_fetch(url: str) -> str:
    """Triton's Prometheus text for the fleet's reads (GPU inventory, drains); OSError when it does not answer."""
    return metrics_text(url, timeout_s=METRICS_TIMEOUT_SECONDS)


def gpus_store(server: TritonServer, gpus: list[dict[str, float]]) -> None:
    """Measured GPUs (parse_gpu_metrics order = index) replace the rows of those indices. A GPU listed at 0
    bytes (a just-restarted Triton before its first metrics poll) keeps its row as it was.

    Triton's used bytes include the instances the planner placed there; the planner counts those itself, so
    only the rest is stored as used by others (counting both made a half-full GPU look full)."""
    placed = placed_bytes_per_gpu(server=server)
    for index, metrics in enumerate(gpus):
        if not metrics.get("nv_gpu_memory_total_bytes"):
            continue
        used = int(metrics.get("nv_gpu_memory_used_bytes", 0))
        Gpu.objects.update_or_create(
            server=server,
            index=index,
            defaults={
                "total_memory_bytes": int(metrics.get("nv_gpu_memory_total_bytes", 0)),
                "used_by_others_bytes": max(0, used - placed.get(index, 0)),
                "utilization": metrics.get("nv_gpu_utilization"),
                "declared": False,
                "name": "nvidia",
            },
        )


def _refresh_gpus(server: TritonServer) -> None:
    gpus_store(server, parse_gpu_metrics(metrics_fetch(server.metrics_url)))


def fleet_heartbeat() -> dict[str, str]:
    """Probe every server once; returns name → state."""
    states = {}
    for server in TritonServer.objects.all():
        client = TritonClient(server.grpc_url, timeout_s=settings.FLEET_PROBE_TIMEOUT_SECONDS)
        try:
            alive = client.is_live()
        finally:
            client.close()
        now = timezone.now()
        if alive:
            if server.real_gpus and server.metrics_url:
                try:
                    _refresh_gpus(server)
                except OSError as exc:
                    logger.warning("gpu metrics of %s unavailable: %s", server.name, exc)
            state = server.operator_state or ServerState.HEALTHY
            update: dict[str, object] = {"state": state, "missed_heartbeats": 0, "last_heartbeat_at": now}
            if server.state == ServerState.UNHEALTHY:
                # Back from an outage (restarted, or resumed after a hang): the breaker's failures were that
                # outage's, and it has just ended. Left open, the breaker would idle the server for up to
                # FLEET_BREAKER_OPEN_SECONDS after the reconciler has loaded its models again (the chaos
                # suite measured work resuming 11 s after the model was ready instead of ~1 s).
                update["breaker_open_until"] = None
                update["consecutive_failures"] = 0
            TritonServer.objects.filter(id=server.id).update(**update)
        else:
            failures = server.missed_heartbeats + 1
            state = server.state
            if failures >= UNHEALTHY_AFTER_FAILURES:
                state = ServerState.UNHEALTHY
                if server.state != ServerState.UNHEALTHY:
                    PlacementEvent.objects.create(
                        server=server,
                        action="server_unhealthy",
                        actor="heartbeat",
                        ok=False,
                        reason=f"{failures} missed heartbeats",
                    )
            TritonServer.objects.filter(id=server.id).update(state=state, missed_heartbeats=failures)
        states[server.name] = state
    return states


def fleet_lost_models() -> list[str]:
    """``server/model`` for each ready placement whose model a live server no longer has loaded. A server
    restarted quicker than two heartbeats is never marked unhealthy, yet it comes back empty (explicit mode),
    and only the reconcile tick (up to 10 s later) would notice: the chaos suite's 3 s Triton restart left
    tinylm unloaded 8.5 s after Triton answered, every shard sent there bouncing off "unknown model". One
    repository-index call per server with ready placements; a server that does not answer is the liveness
    probe's business, not a loss."""
    lost: list[str] = []
    servers = TritonServer.objects.exclude(state=ServerState.UNHEALTHY).filter(placements__status=PlacementStatus.READY)
    for server in servers.distinct():
        client = TritonClient(server.grpc_url, timeout_s=settings.FLEET_PROBE_TIMEOUT_SECONDS)
        try:
            loaded = {m["name"] for m in client.repository_index() if m.get("state") == "READY"}
        except TritonError:
            continue
        finally:
            client.close()
        placed = Placement.objects.filter(server=server, status=PlacementStatus.READY)
        names = placed.values_list("model__triton_name", flat=True)
        lost += [f"{server.name}/{name}" for name in sorted(set(names)) if name not in loaded]
    return lost


def breaker_record(*, server_id: int, ok: bool) -> None:
    """Circuit breaker: after FLEET_BREAKER_FAILURES transient failures in a row the server gets no
    work for FLEET_BREAKER_OPEN_SECONDS; the first call after that is the probe."""
    if ok:
        TritonServer.objects.filter(id=server_id, consecutive_failures__gt=0).update(
            consecutive_failures=0, breaker_open_until=None
        )
        return
    server = TritonServer.objects.filter(id=server_id).first()
    if server is None:
        return
    failures = server.consecutive_failures + 1
    update: dict[str, object] = {"consecutive_failures": failures}
    if failures >= settings.FLEET_BREAKER_FAILURES:
        update["breaker_open_until"] = timezone.now() + timedelta(seconds=settings.FLEET_BREAKER_OPEN_SECONDS)
    TritonServer.objects.filter(id=server_id).update(**update)
