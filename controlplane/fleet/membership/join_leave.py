"""Servers joining and leaving the fleet by themselves: what ``fleet_register`` / ``fleet_drain`` and
``POST /internal/fleet/servers[/<name>/drain]`` call (docs/architecture/fleet-size.md, "Join and leave").

Join: an orchestrator's init step or sidecar registers a Triton server with its addresses and pool; its
GPUs come from Triton's own ``/metrics`` (``nv_gpu_memory_total_bytes`` etc., one series per GPU uuid) when
a metrics URL is given and shows GPUs, else from the declared sizes (CPU hosts, tests).

Leave: a drain is a series of idempotent steps, each a few small queries, repeated until it answers
drained: cordon (state ``draining``: routing sends no new call there, the placement planner re-places its
busy models elsewhere make-before-break and unloads them there) → in-flight calls finish → placements
are gone → the server row is deleted. A server that disappears without draining is not handled here:
the heartbeat marks it unhealthy and the reconciler fails its placements over, as before.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.core.http.errors import Conflict, DomainError, ValidationFailed
from controlplane.fleet.membership.gpu_metrics import parse_gpu_metrics
from controlplane.fleet.membership.inventory import (
    UNHEALTHY_AFTER_FAILURES,
    gpus_store,
    metrics_fetch,
    server_set_operator_state,
)
from controlplane.fleet.models import Gpu, Placement, PlacementEvent, PlacementStatus, ServerState, TritonServer
from controlplane.fleet.work import work_source
from controlplane.triton.client import TritonClient

logger = logging.getLogger(__name__)

# Triton's count of requests received and not yet answered, per model (since Triton 2.33).
_PENDING = re.compile(r"^nv_inference_pending_request_count\{[^}]*\}\s+([0-9.eE+-]+)$")


class MetricsUnavailable(DomainError):
    """The metrics URL did not answer and no GPU was declared: retry once Triton is up."""

    status_code = 503
    error_type = "server_error"
    code = "metrics_unavailable"


@dataclass(frozen=True)
class DrainStatus:
    name: str
    drained: bool  # True: the server is deregistered (or was never registered)
    placements: int = 0  # placements still on it (the reconciler moves them)
    running_shards: int = 0  # shards that may still have calls in flight there
    pending_requests: int | None = None  # Triton's own count, where its metrics answer

    def render(self) -> dict[str, object]:
        return {
            "object": "fleet.server.drain",
            "name": self.name,
            "state": "drained" if self.drained else "draining",
            "placements": self.placements,
            "running_shards": self.running_shards,
            "pending_requests": self.pending_requests,
        }


def server_join(
    *,
    name: str,
    grpc_url: str,
    http_url: str = "",
    metrics_url: str = "",
    pool: str = "default",
    gpu_memory_bytes: list[int] | None = None,
    real_gpus: bool = False,
    actor: str = "fleet",
    force: bool = False,
) -> tuple[TritonServer, bool]:
    """Register or update a server; returns (server, created). Idempotent: the same call again changes
    nothing. Re-registering a server that is draining (an orchestrator restarted it) ends the drain; an
    operator's cordon stays. Raises Conflict when ``grpc_url`` belongs to another server, or when the server
    is live at other addresses and ``force`` is not set (``readdress_check``), ValidationFailed when there are
    neither measured nor declared GPUs, MetricsUnavailable when only the metrics could say."""
    existing = TritonServer.objects.filter(name=name).first()
    if existing is not None and not force:
        readdress_check(existing, grpc_url=grpc_url, http_url=http_url)
    declared = list(gpu_memory_bytes or [])
    measured: list[dict[str, float]] = []
    if metrics_url:
        try:
            listed = parse_gpu_metrics(metrics_fetch(metrics_url))
        except (OSError, ValueError) as exc:
            if not declared:
                raise MetricsUnavailable(
                    f"{metrics_url} did not answer ({exc}) and no GPU memory was declared"
                ) from exc
            logger.warning("metrics of %s unavailable (%s): using the declared GPUs", name, exc)
            listed = []
        measured = [g for g in listed if g.get("nv_gpu_memory_total_bytes")]
        if listed and not measured:
            # Seen on an H200 (docs/GPU.md): a just-started Triton lists its GPUs at 0 bytes until its first
            # metrics poll (2 s by default). A GPU host, so never its declared stand-ins: the caller retries.
            raise MetricsUnavailable(
                f"Triton at {metrics_url} lists {len(listed)} GPU(s) but has not measured them yet; register again"
            )
    if not measured and not declared:
        raise ValidationFailed(
            "no GPU found in Triton's metrics and none declared (gpu_memory_gib)", param="gpu_memory_gib"
        )
    fields: dict[str, object] = {"grpc_url": grpc_url, "http_url": http_url, "metrics_url": metrics_url, "pool": pool}
    fields["real_gpus"] = bool(measured) or real_gpus
    try:
        with transaction.atomic():
            server = TritonServer.objects.select_for_update().filter(name=name).first()
            created = server is None
            if server is None:
                server = TritonServer.objects.create(name=name, **fields)
            else:
                changed = {k: v for k, v in fields.items() if getattr(server, k) != v}
                if changed:
                    moved = _moved(server, grpc_url=grpc_url, http_url=http_url)
                    TritonServer.objects.filter(id=server.id).update(**changed)
                    server.refresh_from_db()
                    if moved:
                        reason = f"re-registered at {', '.join(moved)}" + (" (forced)" if force else "")
                        PlacementEvent.objects.create(
                            server=server, action="server_readdress", actor=actor, reason=reason
                        )
            _gpus_set(server, measured, declared)
            if created:
                PlacementEvent.objects.create(server=server, action="server_join", actor=actor, reason=_joined(server))
    except IntegrityError as exc:
        raise Conflict(f"{grpc_url} is already registered under another name", param="grpc_url") from exc
    if server.operator_state == ServerState.DRAINING:
        server_set_operator_state(server=server, state=None, actor=actor)
        server.refresh_from_db()
    return server, created


def _moved(server: TritonServer, *, grpc_url: str, http_url: str) -> list[str]:
    """The addresses a registration changes (``old → new``); an HTTP URL given for the first time is no move."""
    pairs = (("gRPC", server.grpc_url, grpc_url), ("HTTP", server.http_url, http_url))
    return [f"{kind} {old} → {new or '(none)'}" for kind, old, new in pairs if old and old != new]


def readdress_check(server: TritonServer, *, grpc_url: str, http_url: str) -> None:
    """Refuse (409) to move a live server to other addresses: a second Triton started under the same name by
    mistake (a copied config, a reused pod name) would otherwise take the row, and the one still running
    would keep its models loaded outside the fleet's view. Live means both: the heartbeat found it healthy
    within the time it takes to mark it unhealthy, and its old gRPC address answers now. The second check
    lets the ordinary replacement through at once (a restarted host or pod on a new address: the old one is
    gone, the heartbeat just has not noticed yet). An operator who knows better forces it."""
    moved = _moved(server, grpc_url=grpc_url, http_url=http_url)
    if not moved:
        return
    window = timedelta(seconds=(UNHEALTHY_AFTER_FAILURES + 1) * settings.FLEET_HEARTBEAT_INTERVAL_SECONDS)
    beat = server.last_heartbeat_at
    if beat is None or beat < timezone.now() - window:
        return
    if server.state == ServerState.UNHEALTHY or server.missed_heartbeats:
        return
    client = TritonClient(server.grpc_url, timeout_s=settings.FLEET_PROBE_TIMEOUT_SECONDS)
    try:
        answers = client.is_live()
    finally:
        client.close()
    if answers:
        raise Conflict(
            f"Server {server.name!r} is live at {server.grpc_url} (heartbeat healthy, answering now); refusing to "
            f"re-register it with {'; '.join(moved)}. Drain it first, register the new one under another name, or, "
            'if the old server is really gone, force it (`fleet_register --force`, or `"force": true` on '
            "POST /internal/fleet/servers).",
            param="name",
            code="server_live",
        )


def _gpus_set(server: TritonServer, measured: list[dict[str, float]], declared: list[int]) -> None:
    if measured:
        gpus_store(server, measured)
        count = len(measured)
    else:
        for index, total in enumerate(declared):
            Gpu.objects.update_or_create(
                server=server, index=index, defaults={"total_memory_bytes": total, "declared": True}
            )
        count = len(declared)
    server.gpus.filter(index__gte=count).delete()


def _joined(server: TritonServer) -> str:
    kind = "measured" if server.real_gpus else "declared"
    return f"joined pool {server.pool!r} at {server.grpc_url} with {server.gpus.count()} {kind} GPU(s)"


def _pending_requests(server: TritonServer) -> int | None:
    if not server.metrics_url:
        return None
    try:
        text = metrics_fetch(server.metrics_url)
    except OSError:
        return None  # Triton gone or going: it holds no call we could wait for
    total = 0.0
    for line in text.splitlines():
        match = _PENDING.match(line.strip())
        if match:
            total += float(match.group(1))
    return int(total)


def server_drain(*, name: str, actor: str) -> DrainStatus:
    """One step of a drain; call again until ``drained``. Idempotent: a server already gone is drained."""
    server = TritonServer.objects.filter(name=name).first()
    if server is None:
        return DrainStatus(name, drained=True)
    if server.operator_state != ServerState.DRAINING:
        server_set_operator_state(server=server, state=ServerState.DRAINING, actor=actor)
    placements = Placement.objects.filter(server=server).exclude(status=PlacementStatus.FAILED, instances=0).count()
    running = work_source().shards_routed_to(name)
    pending = _pending_requests(server)
    if placements or running or pending:
        return DrainStatus(name, False, placements, running, pending)
    with transaction.atomic():
        # The row locked before the delete: an event written for the server meanwhile (the heartbeat's, the
        # reconciler's) then commits after this delete and is refused, instead of committing between the delete's
        # SET NULL of the server's events and its DELETE of the row, which failed this commit on the foreign key.
        locked = TritonServer.objects.select_for_update().filter(id=server.id).values_list("id", flat=True)
        # Conditional: a registration that ended the drain meanwhile wins, and the server stays.
        deleted = 0
        if list(locked):
            deleted, _ = TritonServer.objects.filter(id=server.id, operator_state=ServerState.DRAINING).delete()
        if deleted:
            PlacementEvent.objects.create(
                action="server_leave", actor=actor, reason=f"{name} drained and deregistered (pool {server.pool!r})"
            )
    return DrainStatus(name, drained=bool(deleted), pending_requests=pending)
