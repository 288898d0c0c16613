from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Sum
from django.utils import timezone

from controlplane.fleet.models import (
    CatalogueAdapter,
    CatalogueModel,
    Gpu,
    Placement,
    PlacementEvent,
    PlacementStatus,
    ServerState,
    TritonServer,
)

# Servers that get calls (cordoned: no new placements, but keeps serving what it has).
ROUTABLE_STATES = (ServerState.HEALTHY, ServerState.CORDONED)


def fleet_is_managed() -> bool:
    """With no registered servers the service runs unmanaged on TRITON_GRPC_URLS, loading models on first use."""
    return TritonServer.objects.exists()


def model_ready_instances(*, model: CatalogueModel) -> int:
    """The model's instances that take calls now: ready placements on routable servers."""
    total = Placement.objects.filter(
        model=model, status=PlacementStatus.READY, instances__gt=0, server__state__in=ROUTABLE_STATES
    ).aggregate(n=Sum("instances"))["n"]
    return int(total or 0)


def catalogue_model_get(*, name: str) -> CatalogueModel | None:
    return CatalogueModel.objects.filter(name=name, is_enabled=True).first()


def catalogue_models_enabled() -> list[CatalogueModel]:
    return list(CatalogueModel.objects.filter(is_enabled=True).order_by("name"))


def catalogue_adapters_enabled() -> list[CatalogueAdapter]:
    """Enabled LoRA adapters of enabled models, by base then name."""
    adapters = CatalogueAdapter.objects.filter(is_enabled=True, base__is_enabled=True).select_related("base")
    return list(adapters.order_by("base__name", "name"))


def catalogue_adapter_get(*, base: CatalogueModel, name: str) -> CatalogueAdapter | None:
    """The base's enabled adapter of that name (None: no such adapter, or disabled)."""
    if "\x00" in name:  # Postgres text cannot hold a NUL: no adapter has one
        return None
    return CatalogueAdapter.objects.filter(base=base, name=name, is_enabled=True).select_related("base").first()


def catalogue_adapter_names(*, base: CatalogueModel) -> list[str]:
    """The `base:adapter` names a line may use on this base (for error messages)."""
    names = CatalogueAdapter.objects.filter(base=base, is_enabled=True).order_by("name").values_list("name", flat=True)
    return [f"{base.name}:{name}" for name in names]


def catalogue_names() -> list[str]:
    return list(CatalogueModel.objects.filter(is_enabled=True).order_by("name").values_list("name", flat=True))


# -- fleet overview (admin page: servers × GPUs × models) ---------------------------------------------

# Statuses whose instances hold GPU memory, as the planner counts them (reconciler.planner_inputs).
_HOLDS_MEMORY = (PlacementStatus.READY, PlacementStatus.LOADING)
OVERVIEW_EVENTS = 20


@dataclass(frozen=True)
class GpuShare:
    """One placement as seen from one GPU; a gang placement ("0,1") shows up on each GPU it spans."""

    model: str
    gpus: str
    instances: int
    status: str
    memory_bytes: int  # what this placement holds on this one GPU
    avg_queue_ms: float | None
    avg_compute_ms: float | None
    last_error: str

    @property
    def is_gang(self) -> bool:
        return "," in self.gpus


def _percent(part: int, whole: int) -> int:
    # A sliver still shows as 1% so a small model is not invisible in the bar.
    if whole <= 0 or part <= 0:
        return 0
    return max(1, min(100, round(100 * part / whole)))


@dataclass(frozen=True)
class GpuRow:
    index: int
    name: str
    declared: bool
    utilization: float | None
    total_bytes: int
    used_by_others_bytes: int
    shares: tuple[GpuShare, ...]

    @property
    def placed_bytes(self) -> int:
        return sum(share.memory_bytes for share in self.shares)

    @property
    def used_bytes(self) -> int:
        return self.used_by_others_bytes + self.placed_bytes

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)

    @property
    def overcommitted(self) -> bool:
        return self.used_bytes > self.total_bytes

    @property
    def others_percent(self) -> int:
        return _percent(self.used_by_others_bytes, self.total_bytes)

    @property
    def placed_percent(self) -> int:
        return min(100 - self.others_percent, _percent(self.placed_bytes, self.total_bytes))


@dataclass(frozen=True)
class ServerRow:
    id: int
    name: str
    grpc_url: str
    state: str
    operator_state: str | None
    real_gpus: bool
    last_heartbeat_at: datetime | None
    breaker_open_until: datetime | None
    gpus: tuple[GpuRow, ...]
    # Placements naming a GPU index the server does not have (GPU removed since): shown, never hidden.
    stray: tuple[GpuShare, ...]

    @property
    def breaker_open(self) -> bool:
        return self.breaker_open_until is not None and self.breaker_open_until > timezone.now()

    @property
    def instances(self) -> int:
        # Counted once per placement, however many GPUs it spans.
        seen = {(s.model, s.gpus): s.instances for gpu in self.gpus for s in gpu.shares}
        seen.update({(s.model, s.gpus): s.instances for s in self.stray})
        return sum(seen.values())


@dataclass(frozen=True)
class EventRow:
    created_at: datetime
    action: str
    model: str
    server: str
    gpus: str
    before: int
    after: int
    ok: bool
    actor: str
    reason: str
    move_for: str = ""


@dataclass(frozen=True)
class FleetOverview:
    servers: tuple[ServerRow, ...]
    events: tuple[EventRow, ...]
    # Consolidation: the plans (action consolidate) and the moves' halves (move_in / move_out), newest first,
    # each with the model it made room for.
    moves: tuple[EventRow, ...] = ()


def _gpu_indices(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip().isdigit()]


def placed_bytes_per_gpu(*, server: TritonServer) -> dict[int, int]:
    """GPU index → memory the planner's own ready or loading placements on ``server`` hold there (instances ×
    the measured bytes per instance where Triton reported them, else memory_per_instance_bytes, on each GPU of
    a gang). A loading placement counts in full: memory reserved for a load in flight is not free."""
    placed: dict[int, int] = defaultdict(int)
    holding = Placement.objects.filter(server=server, status__in=_HOLDS_MEMORY).select_related("model")
    for placement in holding:
        for index in _gpu_indices(placement.gpus):
            each = placement.measured_memory_bytes or placement.model.memory_per_instance_bytes
            placed[index] += placement.instances * each
    return dict(placed)


def fleet_overview(*, events: int = OVERVIEW_EVENTS) -> FleetOverview:
    """Every server with its GPUs, what sits on each GPU and how full it is, plus the latest events.

    Memory on a GPU is used_by_others plus, for each ready or loading placement spanning it, instances ×
    memory_per_instance_bytes (per GPU: a gang instance needs that much on each of its GPUs)."""
    shares: dict[tuple[int, int], list[GpuShare]] = defaultdict(list)
    for placement in Placement.objects.select_related("model").order_by("model__triton_name", "gpus"):
        holds = placement.status in _HOLDS_MEMORY
        share = GpuShare(
            model=placement.model.triton_name,
            gpus=placement.gpus,
            instances=placement.instances,
            status=placement.status,
            memory_bytes=placement.instances * placement.model.memory_per_instance_bytes if holds else 0,
            avg_queue_ms=placement.avg_queue_ms,
            avg_compute_ms=placement.avg_compute_ms,
            last_error=placement.last_error,
        )
        for index in _gpu_indices(placement.gpus) or [-1]:
            shares[(placement.server_id, index)].append(share)
    gpus_by_server: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.order_by("server_id", "index"):
        gpus_by_server[gpu.server_id].append(gpu)
    servers = []
    for server in TritonServer.objects.order_by("name"):
        gpus = gpus_by_server[server.id]
        known = {gpu.index for gpu in gpus}
        stray = {
            s
            for (server_id, index), found in shares.items()
            if server_id == server.id and index not in known
            for s in found
        }
        servers.append(
            ServerRow(
                id=server.id,
                name=server.name,
                grpc_url=server.grpc_url,
                state=server.state,
                operator_state=server.operator_state,
                real_gpus=server.real_gpus,
                last_heartbeat_at=server.last_heartbeat_at,
                breaker_open_until=server.breaker_open_until,
                gpus=tuple(
                    GpuRow(
                        index=gpu.index,
                        name=gpu.name,
                        declared=gpu.declared,
                        utilization=gpu.utilization,
                        total_bytes=gpu.total_memory_bytes,
                        used_by_others_bytes=gpu.used_by_others_bytes,
                        shares=tuple(shares[(server.id, gpu.index)]),
                    )
                    for gpu in gpus
                ),
                stray=tuple(sorted(stray, key=lambda s: (s.model, s.gpus))),
            )
        )
    recent = PlacementEvent.objects.select_related("model", "server").order_by("-created_at", "-id")
    return FleetOverview(
        servers=tuple(servers),
        events=tuple(_event_row(e) for e in recent[:events]),
        moves=tuple(_event_row(e) for e in recent.exclude(move_for="")[:events]),
    )


def _event_row(e: PlacementEvent) -> EventRow:
    return EventRow(
        created_at=e.created_at,
        action=e.action,
        model=e.model.triton_name if e.model else "",
        server=e.server.name if e.server else "",
        gpus=e.gpus,
        before=e.before,
        after=e.after,
        ok=e.ok,
        actor=e.actor,
        reason=e.reason,
        move_for=e.move_for,
    )
