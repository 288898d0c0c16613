"""Fleet-size planner: a pure function (backlog per model, pool observations, pool limits, params) -> how
many Triton servers each pool should have and how many shard workers, with the inputs behind each answer.

The second loop beside placement (placement/planner.py): placement decides which models run where inside the fleet,
this decides how big the fleet is. Like the placement planner: no Django, no I/O, no clock (``params.now``
is an input), and planning again from the plan with the same inputs changes nothing.

Need, per pool (W = a model's backlog in instance-seconds = work units / measured units per second of one
instance; k = instances per server; H = ``drain_horizon_s``; S = ``startup_s``; u = ``headroom``):

* drain: W / (H * k) servers to serve the backlog within the horizon.
* deadlines: the model's batches in expiry order (earliest deadline first); by the i-th expiry t_i the work
  of batches 1..i (W_i) must be done, and a server started now serves only after S, so W_i / ((t_i - S) * k)
  servers. A batch with t_i < S + 1 s cannot be helped by new servers: it only counts towards later ones.
  This ignores the servers already running, so the figure never depends on the current size (a plan fed
  back as input stays put) and errs on the safe side by S.
* per model max(drain, deadlines), capped at the servers its ``max_instances`` can use; the pool's need is
  their sum / u, at least the servers whose GPU memory holds one instance of every busy model, and at
  least 1 while anything is pending or running.

Decision, from the size last asked for (``previous``, else the registered servers) within [min, max]:

* up, fast: at once when a deadline is at risk or the deadlines alone need more than the current size;
  otherwise only when the need exceeds the current size by more than ``hysteresis`` (no thrash on noise).
* down, slow: only after the need stayed below the current size for ``scale_down_cooldown_s``, never while
  a deadline is at risk, while servers are saturated (Triton queue time or GPU utilisation above target),
  or while servers of the pool are still draining from the previous scale-in (the orchestrator drains
  every server it removes: cordon, in-flight calls finish, placements move, deregister).
* zero: a pool goes to zero only when nothing is pending or running there (and its min is 0). A pool at
  zero stays there until its backlog exceeds ``activation_work_s`` instance-seconds (0: the first work
  wakes it) or waiting longer would put a deadline at risk.

Deadline risk (exported as a gauge): in expiry order, the servers there now cannot finish the work due by
some batch's expiry; for a pool at zero, one server started now could not.

Workers: enough shard workers to keep every planned instance's slots busy, within [min, max].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from controlplane.fleet.placement.planner import _index  # the placement planner's duplicate-checking index
from controlplane.fleet.sizing.types import (
    FleetPlan,
    ModelBacklog,
    PoolLimits,
    PoolMemory,
    PoolObservation,
    PoolPlan,
    SizingParams,
)

__all__ = ["deadline_servers", "plan_fleet"]

# Float noise must not turn 2.0000000001 servers into 3.
_EPS = 1e-9
# A batch due less than a second after new servers could serve cannot be saved by them; counting it would
# ask for a near-infinite fleet.
MIN_WINDOW_S = 1.0


def _ceil(x: float) -> int:
    return max(0, math.ceil(x - _EPS)) if x != math.inf else 2**31


def _clamp(n: int, limits: PoolLimits) -> int:
    return min(max(n, limits.min_servers), limits.max_servers)


def deadline_servers(backlog: ModelBacklog, instances_per_server: int, startup_s: float) -> float:
    """Servers the model's deadlines need if every server started now (earliest deadline first)."""
    need, done_by = 0.0, 0.0
    for d in backlog.deadlines:
        done_by += backlog.seconds(d.work_units)
        window = d.seconds_left - startup_s
        if window >= MIN_WINDOW_S and done_by > 0:
            need = max(need, done_by / (window * instances_per_server))
    return need


def _at_risk(backlogs: Sequence[ModelBacklog], obs: PoolObservation, startup_s: float) -> bool:
    """The pool's servers now (one starting now, for a pool at zero) miss some expiry, in expiry order."""
    items = sorted((d.seconds_left, b.seconds(d.work_units)) for b in backlogs for d in b.deadlines)
    k = obs.instances_per_server
    done_by = 0.0
    for left, seconds in items:
        done_by += seconds
        capacity = obs.servers * k * max(left, 0.0) if obs.servers else k * max(left - startup_s, 0.0)
        if done_by > capacity * (1 + _EPS) + _EPS:
            return True
    return False


def _server_cap(backlog: ModelBacklog, instances_per_server: int) -> float:
    return math.ceil(backlog.max_instances / instances_per_server) if backlog.max_instances else math.inf


def plan_fleet(
    backlogs: Sequence[ModelBacklog],
    observations: Sequence[PoolObservation],
    limits: Sequence[PoolLimits],
    params: SizingParams,
) -> FleetPlan:
    """Plan every pool named by a backlog, an observation or a limit. Raises ValueError on a duplicate
    pool or model."""
    obs = _index(observations, "pool", "observation")
    lim = _index(limits, "pool", "limits")
    backlogs = [_index(backlogs, "model", "backlog")[m] for m in sorted({b.model for b in backlogs})]  # order-free sums
    pools = sorted({b.pool for b in backlogs} | set(obs) | set(lim))
    plans = []
    for pool in sorted(pools):
        limit = lim.get(pool) or PoolLimits(pool, params.default_limits.min_servers, params.default_limits.max_servers)
        plans.append(
            _plan_pool([b for b in backlogs if b.pool == pool], obs.get(pool) or PoolObservation(pool), limit, params)
        )
    instances = sum(p.desired_servers * obs.get(p.pool, PoolObservation(p.pool)).instances_per_server for p in plans)
    workers = _ceil(instances * params.slots_per_instance / params.slots_per_worker)
    return FleetPlan(tuple(plans), min(max(workers, params.min_workers), params.max_workers))


def _plan_pool(backlogs: list[ModelBacklog], obs: PoolObservation, limit: PoolLimits, p: SizingParams) -> PoolPlan:
    k = obs.instances_per_server
    busy = [b for b in backlogs if b.busy]
    work_s = sum(b.seconds(b.work_units) for b in backlogs)
    deadline = sum(min(deadline_servers(b, k, p.startup_s), _server_cap(b, k)) for b in backlogs)
    per_model = sum(
        min(
            max(b.seconds(b.work_units) / (p.drain_horizon_s * k), deadline_servers(b, k, p.startup_s)),
            _server_cap(b, k),
        )
        for b in backlogs
    )
    need = per_model / p.headroom
    if obs.memory_per_server_bytes and busy:
        need = max(need, _ceil(sum(b.memory_per_instance_bytes for b in busy) / obs.memory_per_server_bytes))
    if busy:
        need = max(need, 1.0)
    risk = bool(busy) and _at_risk(backlogs, obs, p.startup_s)
    prev = obs.previous
    ref = _clamp(prev.desired_servers if prev else obs.servers, limit)
    # A pool at zero sleeps through work below the activation threshold (unknown throughput always wakes it).
    wake_signal = sum(b.seconds(b.work_units) if b.units_per_second_per_instance else math.inf for b in busy)
    if ref == 0 and not risk and not any(b.in_flight for b in busy) and wake_signal <= p.activation_work_s:
        need = 0.0
    n = _clamp(_ceil(need), limit)
    head = f"need {need:.2f} server(s) (backlog {work_s:.1f} instance-s, deadlines {deadline:.2f})"
    below_since = None
    saturated = bool(busy) and (
        (obs.queue_ms is not None and obs.queue_ms > p.queue_ms_target)
        or (obs.gpu_utilization is not None and obs.gpu_utilization > p.gpu_utilization_target)
    )
    if n > ref:
        if risk or ref == 0 or _ceil(deadline) > ref or need > ref * (1 + p.hysteresis):
            desired, why = n, "deadline at risk: scaled up at once" if risk else f"scaled up from {ref}"
        else:
            desired, why = ref, f"within {p.hysteresis:.0%} of {ref}: kept (hysteresis)"
    elif n < ref:
        since = prev.below_since if prev and prev.below_since is not None else p.now
        desired = ref
        if risk:
            why = "deadline at risk: no scale-down"
        elif obs.draining:
            below_since, why = since, f"{obs.draining} server(s) still draining: no further scale-down yet"
        elif saturated:
            why = "servers saturated (Triton queue time or GPU utilisation above target): no scale-down"
        elif busy and need >= ref * (1 - p.hysteresis):
            why = f"within {p.hysteresis:.0%} of {ref}: kept (hysteresis)"
        elif p.now - since >= p.scale_down_cooldown_s:
            desired, why = n, f"below {ref} for {p.now - since:g}s: scaled down"
        else:
            below_since, why = since, f"below {ref} for {p.now - since:g}s (< {p.scale_down_cooldown_s:g}s cooldown)"
    else:
        desired, why = ref, "at the size needed"
    return PoolPlan(
        pool=obs.pool,
        desired_servers=desired,
        need_servers=need,
        deadline_servers=deadline,
        backlog_work_s=work_s,
        deadline_risk=risk,
        memory=PoolMemory(desired, below_since),
        reason=f"{head}; {why}",
    )
