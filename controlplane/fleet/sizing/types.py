"""Value types for the fleet-size planner (see planner.py).

Plain frozen dataclasses, like placement/types.py: the planner stays a pure function that can be
property-tested without Django; controlplane/fleet/sizing/plans.py converts rows into these and the plan back
into FleetSizePlan rows. Validation lives in ``__post_init__`` so a malformed input fails at the boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DeadlineWork:
    """Work of one batch still pending or running, and the seconds left until its ``expires_at``."""

    seconds_left: float  # negative: already past
    work_units: float

    def __post_init__(self) -> None:
        if self.work_units < 0:
            raise ValueError("negative work")


@dataclass(frozen=True)
class ModelBacklog:
    """One model's backlog in the pool that serves it.

    ``work_units`` are the scheduler's units (tokens for text models, rows for tensor models) of every
    pending or running shard; ``units_per_second_per_instance`` is the measured throughput of one model
    instance (0 = unknown: the backlog then only wakes the pool, it cannot size it). ``deadlines`` split
    the same work by batch; their sum never exceeds ``work_units``. ``max_instances`` caps how many
    servers can help this model (0 = no cap).
    """

    model: str
    pool: str = "default"
    work_units: float = 0.0
    units_per_second_per_instance: float = 0.0
    deadlines: tuple[DeadlineWork, ...] = ()
    in_flight: int = 0  # running shards
    memory_per_instance_bytes: int = 0
    max_instances: int = 0

    def __post_init__(self) -> None:
        deadlines = (d if isinstance(d, DeadlineWork) else DeadlineWork(*d) for d in self.deadlines)
        object.__setattr__(self, "deadlines", tuple(sorted(deadlines, key=lambda d: (d.seconds_left, d.work_units))))
        if self.work_units < 0 or self.units_per_second_per_instance < 0 or self.in_flight < 0:
            raise ValueError(f"negative backlog for {self.model!r}")
        if self.memory_per_instance_bytes < 0 or self.max_instances < 0:
            raise ValueError(f"invalid profile for {self.model!r}")
        if sum(d.work_units for d in self.deadlines) > self.work_units * (1 + 1e-9) + 1e-9:
            raise ValueError(f"deadline work of {self.model!r} exceeds its backlog")

    @property
    def busy(self) -> bool:
        return self.work_units > 0 or self.in_flight > 0

    def seconds(self, units: float) -> float:
        """Instance-seconds to serve ``units`` (0 when the throughput is unknown)."""
        rate = self.units_per_second_per_instance
        return units / rate if rate > 0 else 0.0


@dataclass(frozen=True)
class PoolMemory:
    """What the previous plan of a pool remembers: its answer, and since when the need has stayed below
    it (the scale-down cooldown runs from there; ``None``: it has not)."""

    desired_servers: int
    below_since: float | None = None

    def __post_init__(self) -> None:
        if self.desired_servers < 0:
            raise ValueError("negative desired_servers")


@dataclass(frozen=True)
class PoolObservation:
    """A pool (one kind of GPU node) as observed now.

    ``servers`` are registered servers that serve or will (healthy, cordoned, unhealthy);
    ``draining`` those being emptied before they leave. ``instances_per_server`` is how many model
    instances one server of this kind runs side by side (its GPUs); ``memory_per_server_bytes`` its GPU
    memory (0 = unknown). Triton's queue and compute time per request and the GPUs' utilisation (0..1)
    are ``None`` where nothing was measured.
    """

    pool: str
    servers: int = 0
    draining: int = 0
    instances_per_server: int = 1
    memory_per_server_bytes: int = 0
    queue_ms: float | None = None
    compute_ms: float | None = None
    gpu_utilization: float | None = None
    previous: PoolMemory | None = None

    def __post_init__(self) -> None:
        if self.servers < 0 or self.draining < 0 or self.instances_per_server < 1 or self.memory_per_server_bytes < 0:
            raise ValueError(f"invalid observation of pool {self.pool!r}")


@dataclass(frozen=True)
class PoolLimits:
    pool: str
    min_servers: int = 0
    max_servers: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.min_servers <= self.max_servers:
            raise ValueError(f"need 0 <= min_servers <= max_servers for pool {self.pool!r}")


@dataclass(frozen=True)
class SizingParams:
    """Knobs of the sizing rules (planner.py's docstring); ``now`` is an input so the planner reads no clock."""

    now: float
    drain_horizon_s: float = 300.0  # backlog without a nearer deadline is planned to drain within this
    startup_s: float = 60.0  # a new server's start plus its model loads: it serves only after this
    headroom: float = 0.8  # planned utilisation of the servers asked for (< 1 leaves room for noise)
    hysteresis: float = 0.2  # relative change of need tolerated without resizing
    scale_down_cooldown_s: float = 300.0  # need must stay below the current size this long
    activation_work_s: float = 0.0  # a pool at zero wakes when its backlog exceeds this many instance-seconds
    queue_ms_target: float = 500.0  # Triton queue time per request above which servers count as saturated
    gpu_utilization_target: float = 0.9  # GPU utilisation above which servers count as saturated
    default_limits: PoolLimits = field(default_factory=lambda: PoolLimits("*", 0, 1))  # pools not listed
    slots_per_instance: float = 2.0  # shards one model instance keeps busy at once
    slots_per_worker: int = 4  # shards one shard worker runs at once (its concurrency)
    min_workers: int = 0
    max_workers: int = 16

    def __post_init__(self) -> None:
        if self.drain_horizon_s <= 0 or self.startup_s < 0 or not 0 < self.headroom <= 1:
            raise ValueError("need drain_horizon_s > 0, startup_s >= 0 and 0 < headroom <= 1")
        if not 0 <= self.hysteresis < 1 or self.scale_down_cooldown_s < 0 or self.activation_work_s < 0:
            raise ValueError("need 0 <= hysteresis < 1, scale_down_cooldown_s >= 0, activation_work_s >= 0")
        if self.slots_per_instance <= 0 or self.slots_per_worker < 1 or not 0 <= self.min_workers <= self.max_workers:
            raise ValueError("need slots_per_instance > 0, slots_per_worker >= 1, 0 <= min_workers <= max_workers")


@dataclass(frozen=True)
class PoolPlan:
    """The answer for one pool, with the inputs it came from (stored as FleetSizePlan.inputs)."""

    pool: str
    desired_servers: int
    need_servers: float  # before limits, hysteresis and cooldown
    deadline_servers: float  # what the deadlines alone need (0: none at stake)
    backlog_work_s: float  # instance-seconds of backlog
    deadline_risk: bool  # the servers there now cannot finish some batch's work by its expiry
    memory: PoolMemory
    reason: str


@dataclass(frozen=True)
class FleetPlan:
    pools: tuple[PoolPlan, ...]  # sorted by pool
    desired_workers: int


@dataclass(frozen=True)
class FleetScaling:
    """The fleet-size loop's settings and those of servers joining and leaving, as one typed object:
    ``settings.FLEET_SCALING``, read from the environment by controlplane/settings/fleet.py."""

    # How often beat recomputes the plan: a tenth of the 300 s scale-down cooldown and at most a few
    # seconds behind the placement loop (10 s), so a flood is seen within one reconcile interval.
    interval_s: float = 10.0
    pools: dict[str, PoolLimits] = field(default_factory=dict)
    default_limits: PoolLimits = field(default_factory=lambda: PoolLimits("*", 0, 4))
    drain_horizon_s: float = 300.0  # plan to finish a backlog without a nearer deadline within 5 minutes
    startup_s: float = 60.0  # a GPU node's Triton start plus model loads, before it serves anything
    headroom: float = 0.8  # plan servers for 80 % utilisation: measured throughput is an average
    hysteresis: float = 0.2  # like FLEET_HYSTERESIS for instances: ±20 % need moves nothing
    scale_down_cooldown_s: float = 300.0  # KEDA/HPA's default scale-down stabilisation window
    activation_work_s: float = 0.0  # instance-seconds that wake a pool at zero (0: the first line does)
    queue_ms_target: float = 500.0  # Triton queue time per request that counts as saturated
    gpu_utilization_target: float = 0.9
    worker_slots: int = 4  # shard worker concurrency (deploy/local WORKER_CONCURRENCY, --concurrency)
    min_workers: int = 0
    max_workers: int = 16
    instances_per_server: int = 1  # for pools with no registered server to count GPUs on
    # Registration and drain (POST /internal/fleet/...): bearer token; unset, the endpoints refuse (403).
    token: str = ""
    drain_poll_s: float = 1.0  # a waiting drain re-checks this often; each check is a few small queries


def parse_pools(text: str) -> tuple[dict[str, PoolLimits], PoolLimits | None]:
    """``"default=0:4,*=0:2"`` → ({pool: limits}, the ``*`` limits or None); ValueError on a bad entry."""
    pools: dict[str, PoolLimits] = {}
    fallback = None
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, bounds = entry.partition("=")
        lo, colon, hi = bounds.partition(":")
        if not sep or not colon or not name.strip():
            raise ValueError(f"{entry!r} is not POOL=MIN:MAX")
        limits = PoolLimits(name.strip(), int(lo), int(hi))
        if limits.pool == "*":
            fallback = limits
        else:
            pools[limits.pool] = limits
    return pools, fallback
