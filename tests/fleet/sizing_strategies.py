"""Hypothesis strategies for the fleet-size planner's property tests (test_sizing_properties.py)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from controlplane.fleet.sizing.planner import plan_fleet
from controlplane.fleet.sizing.types import (
    DeadlineWork,
    FleetPlan,
    ModelBacklog,
    PoolLimits,
    PoolMemory,
    PoolObservation,
    SizingParams,
)

NOW = 1_000_000.0
# SIZING_EXAMPLES=5000 for a deep run; the default keeps the module to seconds on 2 cores.
SETTINGS = settings(
    max_examples=int(os.environ.get("SIZING_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
POOLS = ("default", "a100", "l4")


@dataclass(frozen=True)
class Case:
    backlogs: tuple[ModelBacklog, ...]
    observations: tuple[PoolObservation, ...]
    limits: tuple[PoolLimits, ...]
    params: SizingParams

    def run(self, **overrides) -> FleetPlan:
        args = dict(backlogs=self.backlogs, observations=self.observations, limits=self.limits, params=self.params)
        args.update(overrides)
        return plan_fleet(**args)

    def limit(self, pool: str) -> PoolLimits:
        return next((lim for lim in self.limits if lim.pool == pool), self.params.default_limits)

    def obs(self, pool: str) -> PoolObservation:
        return next((o for o in self.observations if o.pool == pool), PoolObservation(pool))

    def ref(self, pool: str) -> int:
        """The size the planner starts from: its previous answer, else the registered servers, clamped."""
        o, lim = self.obs(pool), self.limit(pool)
        start = o.previous.desired_servers if o.previous else o.servers
        return min(max(start, lim.min_servers), lim.max_servers)

    def in_pool(self, pool: str) -> list[ModelBacklog]:
        return [b for b in self.backlogs if b.pool == pool]

    def scaled(self, factor: float) -> Case:
        """The same case with every model's backlog (and each batch's share of it) times ``factor``."""
        return replace(
            self,
            backlogs=tuple(
                replace(
                    b,
                    work_units=b.work_units * factor,
                    deadlines=tuple(replace(d, work_units=d.work_units * factor) for d in b.deadlines),
                )
                for b in self.backlogs
            ),
        )

    def fed_back(self, plan: FleetPlan, step_s: float) -> Case:
        """The next tick under constant input: the plan's memory becomes ``previous``, time moves on."""
        memory = {p.pool: p.memory for p in plan.pools}
        observations = tuple(replace(o, previous=memory.get(o.pool)) for o in self.observations)
        known = {o.pool for o in observations}
        observations += tuple(PoolObservation(pool, previous=m) for pool, m in memory.items() if pool not in known)
        return replace(self, observations=observations, params=replace(self.params, now=self.params.now + step_s))


def deadline_need(b: ModelBacklog, k: int, startup_s: float) -> float:
    """Independent restatement: servers started now that finish every batch's work (earliest expiry first)
    by its expiry, for the batches new servers can still help, capped by what max_instances can use."""
    if b.units_per_second_per_instance <= 0:
        return 0.0
    best, total = 0.0, 0.0
    for d in sorted(b.deadlines, key=lambda d: d.seconds_left):
        total += d.work_units / b.units_per_second_per_instance
        if d.seconds_left - startup_s >= 1.0 and total > 0:  # sizing.MIN_WINDOW_S
            best = max(best, total / ((d.seconds_left - startup_s) * k))
    cap = math.ceil(b.max_instances / k) if b.max_instances else math.inf
    return min(best, cap)


@st.composite
def backlogs(draw, pools=POOLS):
    out = []
    for i in range(draw(st.integers(0, 4))):
        deadlines = draw(
            st.lists(
                st.builds(
                    DeadlineWork,
                    seconds_left=st.floats(-120, 24 * 3600, allow_nan=False),
                    work_units=st.sampled_from([0.0, 1.0, 50.0, 2_000.0, 100_000.0]) | st.floats(0, 1e6),
                ),
                max_size=3,
            )
        )
        extra = draw(st.sampled_from([0.0, 0.0, 10.0, 5_000.0]))
        out.append(
            ModelBacklog(
                model=f"m{i}",
                pool=draw(st.sampled_from(pools)),
                work_units=sum(d.work_units for d in deadlines) + extra,
                units_per_second_per_instance=draw(st.sampled_from([0.0, 0.5, 20.0, 3_000.0]) | st.floats(0.01, 1e4)),
                deadlines=tuple(deadlines),
                in_flight=draw(st.sampled_from([0, 0, 1, 3])),
                memory_per_instance_bytes=draw(st.sampled_from([0, 1, 4, 16])),
                max_instances=draw(st.integers(0, 8)),
            )
        )
    return tuple(out)


@st.composite
def observations(draw, pools=POOLS):
    out = []
    for pool in draw(st.lists(st.sampled_from(pools), unique=True)):
        previous = draw(
            st.none()
            | st.builds(PoolMemory, st.integers(0, 9), st.none() | st.floats(NOW - 2_000, NOW, allow_nan=False))
        )
        out.append(
            PoolObservation(
                pool=pool,
                servers=draw(st.integers(0, 6)),
                draining=draw(st.sampled_from([0, 0, 0, 1, 2])),
                instances_per_server=draw(st.integers(1, 4)),
                memory_per_server_bytes=draw(st.sampled_from([0, 8, 16, 64])),
                queue_ms=draw(st.none() | st.floats(0, 2_000)),
                compute_ms=draw(st.none() | st.floats(0, 500)),
                gpu_utilization=draw(st.none() | st.floats(0, 1)),
                previous=previous,
            )
        )
    return tuple(out)


@st.composite
def limits(draw, pools=POOLS):
    out = []
    for pool in draw(st.lists(st.sampled_from(pools), unique=True)):
        lo = draw(st.integers(0, 2))
        out.append(PoolLimits(pool, lo, draw(st.integers(max(lo, 1), 10))))
    return tuple(out)


@st.composite
def params(draw):
    lo = draw(st.integers(0, 2))
    return SizingParams(
        now=NOW,
        drain_horizon_s=draw(st.sampled_from([60.0, 300.0, 3_600.0])),
        startup_s=draw(st.sampled_from([0.0, 30.0, 120.0])),
        headroom=draw(st.sampled_from([0.5, 0.8, 1.0])),
        hysteresis=draw(st.sampled_from([0.0, 0.2, 0.5])),
        scale_down_cooldown_s=draw(st.sampled_from([0.0, 60.0, 300.0])),
        activation_work_s=draw(st.sampled_from([0.0, 0.0, 5.0, 600.0])),
        queue_ms_target=draw(st.sampled_from([100.0, 500.0])),
        gpu_utilization_target=draw(st.sampled_from([0.5, 0.9])),
        default_limits=PoolLimits("*", lo, draw(st.integers(max(lo, 1), 6))),
        slots_per_instance=draw(st.sampled_from([1.0, 2.0])),
        slots_per_worker=draw(st.integers(1, 8)),
        min_workers=draw(st.integers(0, 2)),
        max_workers=draw(st.integers(2, 30)),
    )


CASES = st.builds(Case, backlogs(), observations(), limits(), params())
