"""Settings of the fleet-size loop and of servers joining and leaving, read from the environment once
(settings.FLEET_SCALING). Kept out of settings.py like openapi_settings and storage_settings; tests replace
``settings.FLEET_SCALING`` with ``dataclasses.replace(...)``.

Pools: ``FLEET_POOLS="default=0:4,a100=1:8"`` gives each pool (one kind of GPU node; ``TritonServer.pool``)
its min and max servers; ``*=MIN:MAX`` sets them for pools not listed. Min 0 lets an idle pool scale to
zero (its first work wakes it, see ``FLEET_ACTIVATION_WORK_SECONDS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from controlplane.core.env import env_float, env_int, env_str
from controlplane.fleet.sizing_types import PoolLimits


@dataclass(frozen=True)
class FleetScaling:
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


def from_env() -> FleetScaling:
    raw = env_str("FLEET_POOLS", "*=0:4")
    try:
        pools, fallback = parse_pools(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"FLEET_POOLS: {exc}") from exc
    return FleetScaling(
        interval_s=env_float("FLEET_SIZE_INTERVAL_SECONDS", 10.0),
        pools=pools,
        default_limits=fallback or PoolLimits("*", 0, 4),
        drain_horizon_s=env_float("FLEET_DRAIN_HORIZON_SECONDS", 300.0),
        startup_s=env_float("FLEET_STARTUP_SECONDS", 60.0),
        headroom=env_float("FLEET_SIZE_HEADROOM", 0.8),
        hysteresis=env_float("FLEET_SIZE_HYSTERESIS", 0.2),
        scale_down_cooldown_s=env_float("FLEET_SCALE_DOWN_COOLDOWN_SECONDS", 300.0),
        activation_work_s=env_float("FLEET_ACTIVATION_WORK_SECONDS", 0.0),
        queue_ms_target=env_float("FLEET_QUEUE_MS_TARGET", 500.0),
        gpu_utilization_target=env_float("FLEET_GPU_UTILIZATION_TARGET", 0.9),
        worker_slots=env_int("FLEET_WORKER_SLOTS", 4, minimum=1),
        min_workers=env_int("FLEET_MIN_WORKERS", 0, minimum=0),
        max_workers=env_int("FLEET_MAX_WORKERS", 16, minimum=0),
        instances_per_server=env_int("FLEET_INSTANCES_PER_SERVER", 1, minimum=1),
        token=env_str("FLEET_TOKEN", ""),
        drain_poll_s=env_float("FLEET_DRAIN_POLL_SECONDS", 1.0),
    )


def beat_entry(scaling: FleetScaling) -> dict[str, Any]:
    """The CELERY_BEAT_SCHEDULE entry of ``fleet.size_plan`` (interval: FleetScaling.interval_s)."""
    return {"task": "fleet.size_plan", "schedule": timedelta(seconds=scaling.interval_s)}
