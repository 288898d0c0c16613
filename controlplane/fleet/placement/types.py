"""Value types for the placement planner (see planner.py).

Plain frozen dataclasses so the planner stays a pure function that can be property-tested without Django;
the fleet app converts its model rows into these and the plan back into placement rows and events.
Validation lives in ``__post_init__`` so a malformed row fails loudly at the boundary instead of producing
a silently wrong plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ServerState(str, Enum):
    HEALTHY = "healthy"  # gets new placements
    CORDONED = "cordoned"  # keeps what it has (may shrink), gets nothing new
    DRAINING = "draining"  # being emptied: keeps a model only while it has no capacity elsewhere
    UNHEALTHY = "unhealthy"  # cannot serve: every placement on it is dropped


class ChangeKind(str, Enum):
    LOAD = "load"
    SCALE_UP = "scale_up"
    SCALE_DOWN = "scale_down"
    UNLOAD = "unload"


def _sorted_unique(values: tuple[int, ...], what: str) -> tuple[int, ...]:
    norm = tuple(sorted(int(v) for v in values))
    if len(set(norm)) != len(norm) or any(v < 0 for v in norm):
        raise ValueError(f"{what} must be distinct non-negative GPU indices, got {values!r}")
    return norm


@dataclass(frozen=True)
class ModelDemand:
    """What one model needs right now.

    ``in_flight`` counts work units (shards) currently executing; it only marks the model as busy (busy
    models are never evicted) and is not converted into instances. ``last_active_at`` is the last time the
    model had pending or in-flight work; ``None`` means never (treated as idle for longer than any TTL).
    ``loading``: every placed instance of the model is still loading (none ready), so consolidation never
    moves it; ``last_moved_at``: when consolidation last moved one of its instances (its cooldown).
    """

    model: str
    pending_lines: int = 0
    lines_per_second_per_instance: float = 0.0  # measured throughput profile; 0 = unknown
    last_active_at: float | None = None
    in_flight: int = 0
    loading: bool = False
    last_moved_at: float | None = None

    def __post_init__(self) -> None:
        if self.pending_lines < 0 or self.in_flight < 0 or self.lines_per_second_per_instance < 0:
            raise ValueError(f"negative demand for {self.model!r}")

    @property
    def busy(self) -> bool:
        return self.pending_lines > 0 or self.in_flight > 0


@dataclass(frozen=True)
class Server:
    server_id: str
    state: ServerState = ServerState.HEALTHY
    pool: str = "default"  # one kind of GPU node (TritonServer.pool)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", ServerState(self.state))


@dataclass(frozen=True)
class Gpu:
    """One GPU. ``used_by_others_bytes`` is memory held by anything the planner does not manage."""

    server_id: str
    index: int
    total_memory_bytes: int
    used_by_others_bytes: int = 0

    def __post_init__(self) -> None:
        if self.index < 0 or self.total_memory_bytes < 0 or self.used_by_others_bytes < 0:
            raise ValueError(f"invalid GPU {self.server_id}:{self.index}")


@dataclass(frozen=True)
class ModelProfile:
    """Measured cost of one model instance.

    ``memory_per_instance_bytes`` is what ONE instance needs on EACH of its GPUs (what NVML shows per
    device); a gang model (``gpus_per_instance`` = k > 1) takes that much on each of k GPUs of one server.
    Pins: ``pin_server`` restricts the server; ``pin_gpus`` is the set of GPU indices the model may use
    (a gang model pinned to exactly its k indices is placed on exactly those). ``pool``: only servers of that
    pool take the model (the fleet-size loop adds servers to it for the model's backlog).
    """

    model: str
    memory_per_instance_bytes: int
    load_time_s: float
    gpus_per_instance: int = 1
    min_instances: int = 0
    max_instances: int = 1
    pin_server: str | None = None
    pin_gpus: tuple[int, ...] = ()
    # Servers where a load of this model recently failed: no new instances there until the backoff ends.
    avoid_servers: tuple[str, ...] = ()
    pool: str = "default"

    def __post_init__(self) -> None:
        object.__setattr__(self, "pin_gpus", _sorted_unique(tuple(self.pin_gpus), "pin_gpus"))
        object.__setattr__(self, "avoid_servers", tuple(sorted(set(self.avoid_servers))))
        if self.memory_per_instance_bytes <= 0 or self.load_time_s < 0 or self.gpus_per_instance < 1:
            raise ValueError(f"invalid profile for {self.model!r}")
        if not 0 <= self.min_instances <= self.max_instances or self.max_instances < 1:
            raise ValueError(f"need 0 <= min_instances <= max_instances and max >= 1 for {self.model!r}")
        if self.pin_gpus and len(self.pin_gpus) < self.gpus_per_instance:
            raise ValueError(f"{self.model!r} pins fewer GPUs than one instance needs")


@dataclass(frozen=True, order=True)
class Placement:
    """``instances`` copies of ``model`` on ``server_id``; each copy spans every GPU in ``gpus``.

    For a single-GPU model ``gpus`` has one index (Triton ``instance_group { count: instances, gpus: [i] }``).
    For a gang model it lists the k GPUs each instance spans together. Careful when rendering that to
    Triton: there ``count`` is per listed GPU, so ``{count: n, gpus: [0, 1]}`` would start 2n single-GPU
    copies; a tensor-parallel backend instead needs its own multi-GPU setting (e.g. KIND_MODEL).
    """

    model: str
    server_id: str
    gpus: tuple[int, ...]
    instances: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", _sorted_unique(tuple(self.gpus), "gpus"))
        if not self.gpus or self.instances < 1:
            raise ValueError(f"placement of {self.model!r} needs GPUs and instances >= 1")

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        return (self.model, self.server_id, self.gpus)


@dataclass(frozen=True)
class PlannerParams:
    """``now`` is an input so the planner never reads a clock (deterministic, testable)."""

    now: float
    idle_ttl_s: float = 600.0
    interval_s: float = 60.0  # horizon over which a new load must pay back its load time
    hysteresis: float = 0.2  # relative demand change tolerated without resizing
    max_moves: int = 2  # consolidation moves per interval (consolidation.py)
    moves_done: int = 0  # consolidation moves already made in the current interval
    move_cooldown_s: float = 600.0  # a moved model is not moved again for this long (no ping-pong)

    def __post_init__(self) -> None:
        if self.idle_ttl_s < 0 or self.interval_s <= 0 or not 0 <= self.hysteresis < 1:
            raise ValueError("need idle_ttl_s >= 0, interval_s > 0 and 0 <= hysteresis < 1")
        if self.max_moves < 0 or self.moves_done < 0 or self.move_cooldown_s < 0:
            raise ValueError("need max_moves, moves_done and move_cooldown_s >= 0")


@dataclass(frozen=True)
class Change:
    """One step for the reconciler; ``reason`` is the text for the placement event row."""

    kind: ChangeKind
    model: str
    server_id: str
    gpus: tuple[int, ...]
    before: int
    after: int
    reason: str = ""
    move_for: str = ""  # set on both halves of a consolidation move: the model it makes room for


@dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...]  # sorted by (model, server_id, gpus)
    changes: tuple[Change, ...]  # make-before-break order, see diff_placements (and execution_phases)
    notes: tuple[str, ...] = ()  # model-level facts with no change attached (e.g. "fits nowhere")
    made_room_for: tuple[str, ...] = ()  # models placed by consolidation in this plan: load them last
