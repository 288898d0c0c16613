"""The fleet-size loop's database side: read the planner's inputs (backlog per model in work units by batch
deadline, measured throughput, the servers of each pool with Triton's queue time and GPU readings, the
previous plan), run the pure planner (sizing/planner.py) and store one FleetSizePlan row per pool."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime
from statistics import fmean
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.fleet.models import (
    CatalogueModel,
    FleetSizePlan,
    Gpu,
    Placement,
    PlacementEvent,
    PlacementStatus,
    ServerState,
    TritonServer,
)
from controlplane.fleet.placement.demand import units_per_second_per_instance
from controlplane.fleet.sizing import planner as sizing
from controlplane.fleet.sizing import types as st
from controlplane.fleet.sizing.types import FleetScaling
from controlplane.fleet.work import work_source

logger = logging.getLogger(__name__)


def _backlogs(now: datetime) -> list[st.ModelBacklog]:
    """Work of every pending or running shard of a running batch, per model and batch deadline. Pending
    work of a paused tenant or model is left out: it cannot run, so servers would not help it."""
    models = {m.name: m for m in CatalogueModel.objects.filter(is_enabled=True)}
    work: dict[str, list[st.DeadlineWork]] = defaultdict(list)
    running: dict[str, int] = defaultdict(int)
    for row in work_source().schedulable_backlog():
        model = models.get(row.model)
        if model is None:
            continue
        units = row.work_units if row.work_units is not None else float(row.lines)  # lines: rows before work units
        if model.paused:
            units = row.running_work_units
        running[model.name] += row.running_shards
        left = (row.expires_at - now).total_seconds()
        work[model.name].append(st.DeadlineWork(seconds_left=left, work_units=units))
    return [
        st.ModelBacklog(
            model=name,
            pool=m.pool,
            work_units=sum(d.work_units for d in work[name]),
            units_per_second_per_instance=units_per_second_per_instance(m),
            deadlines=tuple(work[name]),
            in_flight=running[name],
            memory_per_instance_bytes=m.memory_per_instance_bytes,
            max_instances=m.max_instances,
        )
        for name, m in sorted(models.items())
        if name in work
    ]


def _observations(scaling: FleetScaling) -> list[st.PoolObservation]:
    servers = list(TritonServer.objects.values("id", "pool", "state"))
    gpus: dict[int, list[Gpu]] = defaultdict(list)
    for gpu in Gpu.objects.all():
        gpus[gpu.server_id].append(gpu)
    timings: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in Placement.objects.filter(status=PlacementStatus.READY, avg_queue_ms__isnull=False).values(
        "server__pool", "avg_queue_ms", "avg_compute_ms"
    ):
        timings[row["server__pool"]].append((float(row["avg_queue_ms"] or 0.0), float(row["avg_compute_ms"] or 0.0)))
    previous = {p.pool: p for p in FleetSizePlan.objects.all()}
    pools = sorted({s["pool"] for s in servers} | set(previous))
    out = []
    for pool in pools:
        members = [s for s in servers if s["pool"] == pool]
        pool_gpus = [g for s in members for g in gpus[s["id"]]]
        readings = [g.utilization for g in pool_gpus if g.utilization is not None and not g.declared]
        prev = previous.get(pool)
        out.append(
            st.PoolObservation(
                pool=pool,
                servers=sum(1 for s in members if s["state"] != ServerState.DRAINING),
                draining=sum(1 for s in members if s["state"] == ServerState.DRAINING),
                instances_per_server=max(1, round(len(pool_gpus) / len(members)))
                if pool_gpus
                else scaling.instances_per_server,
                memory_per_server_bytes=sum(g.total_memory_bytes for g in pool_gpus) // len(members)
                if pool_gpus
                else 0,
                queue_ms=fmean(q for q, _ in timings[pool]) if timings[pool] else None,
                compute_ms=fmean(c for _, c in timings[pool]) if timings[pool] else None,
                gpu_utilization=fmean(readings) if readings else None,
                previous=st.PoolMemory(prev.desired_servers, prev.inputs.get("below_since")) if prev else None,
            )
        )
    return out


def sizing_inputs(
    now: datetime,
) -> tuple[list[st.ModelBacklog], list[st.PoolObservation], list[st.PoolLimits], st.SizingParams]:
    scaling: FleetScaling = settings.FLEET_SCALING
    params = st.SizingParams(
        now=now.timestamp(),
        drain_horizon_s=scaling.drain_horizon_s,
        startup_s=scaling.startup_s,
        headroom=scaling.headroom,
        hysteresis=scaling.hysteresis,
        scale_down_cooldown_s=scaling.scale_down_cooldown_s,
        activation_work_s=scaling.activation_work_s,
        queue_ms_target=scaling.queue_ms_target,
        gpu_utilization_target=scaling.gpu_utilization_target,
        default_limits=scaling.default_limits,
        slots_per_instance=settings.SCHEDULER_CALLS_PER_INSTANCE / settings.DISPATCH_INFLIGHT_CALLS,
        slots_per_worker=scaling.worker_slots,
        min_workers=scaling.min_workers,
        max_workers=max(scaling.min_workers, scaling.max_workers),
    )
    return _backlogs(now), _observations(scaling), list(scaling.pools.values()), params


def fleet_size_plan(*, actor: str = "sizer") -> st.FleetPlan:
    """Compute the plan and store it: one FleetSizePlan row per pool (rows of pools gone are deleted), and
    a PlacementEvent whenever a pool's desired size changes, so the admin shows when and why."""
    now = timezone.now()
    backlogs, observations, limits, params = sizing_inputs(now)
    result = sizing.plan_fleet(backlogs, observations, limits, params)
    observed = {o.pool: o for o in observations}
    with transaction.atomic():
        before = dict(FleetSizePlan.objects.select_for_update().values_list("pool", "desired_servers"))
        for pool in result.pools:
            FleetSizePlan.objects.update_or_create(
                pool=pool.pool,
                defaults={
                    "desired_servers": pool.desired_servers,
                    "desired_workers": result.desired_workers,
                    "inputs": _inputs_json(
                        pool,
                        observed.get(pool.pool) or st.PoolObservation(pool.pool),
                        [b for b in backlogs if b.pool == pool.pool],
                    ),
                    "computed_at": now,
                },
            )
            if before.get(pool.pool, -1) != pool.desired_servers:
                PlacementEvent.objects.create(
                    action="fleet_size",
                    before=max(0, before.get(pool.pool, 0)),
                    after=pool.desired_servers,
                    actor=actor,
                    reason=f"pool {pool.pool}: {pool.reason}"[:2000],
                )
        FleetSizePlan.objects.exclude(pool__in=[p.pool for p in result.pools]).delete()
    return result


def _finite(value: float, digits: int) -> float | None:
    """JSON (and Postgres' jsonb) has no infinity: a figure that overflowed is stored as null."""
    return round(value, digits) if math.isfinite(value) else None


def _inputs_json(pool: st.PoolPlan, obs: st.PoolObservation, backlogs: list[st.ModelBacklog]) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "need_servers": _finite(pool.need_servers, 4),
        "deadline_servers": _finite(pool.deadline_servers, 4),
        "backlog_work_seconds": _finite(pool.backlog_work_s, 3),
        "deadline_risk": pool.deadline_risk,
        "below_since": pool.memory.below_since,
        "reason": pool.reason,
        "models": {
            b.model: {
                "work_units": b.work_units,
                "units_per_second_per_instance": round(b.units_per_second_per_instance, 3),
                "running_shards": b.in_flight,
                "earliest_deadline_seconds": round(b.deadlines[0].seconds_left, 1) if b.deadlines else None,
            }
            for b in backlogs
        },
    }
    inputs.update({k: v for k, v in asdict(obs).items() if k not in ("pool", "previous")})
    return inputs
