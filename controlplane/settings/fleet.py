"""Settings of Triton, the placement loop and the fleet-size loop (docs/ARCHITECTURE.md, "Placement loop").

The fleet-size loop's values are one typed object, ``FLEET_SCALING`` (fleet/sizing_types.FleetScaling);
tests replace it with ``dataclasses.replace(settings.FLEET_SCALING, ...)``. Pools:
``FLEET_POOLS="default=0:4,a100=1:8"`` gives each pool (one kind of GPU node; ``TritonServer.pool``) its min
and max servers; ``*=MIN:MAX`` sets them for pools not listed. Min 0 lets an idle pool scale to zero (its
first work wakes it, see ``FLEET_ACTIVATION_WORK_SECONDS``).
"""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from controlplane.core.env import env_bool, env_float, env_int, env_list, env_str
from controlplane.fleet.sizing.types import FleetScaling, PoolLimits, parse_pools
from controlplane.settings.paths import BASE_DIR

# --- Triton ---------------------------------------------------------------------------------------
TRITON_GRPC_URLS = env_list("TRITON_GRPC_URLS", ["127.0.0.1:8011"])
TRITON_TIMEOUT_SECONDS = env_float("TRITON_TIMEOUT_SECONDS", 120.0)
# Each prefork shard-worker process loads the enabled generation models' tokenizers in the background as it
# starts (controlplane/celery.py): a tokenizer that only transformers loads (kinds/generation/tokenizer.py) means
# importing transformers and torch, 3–5 s, up to 35 s on a loaded host, inside the first generation shard each
# process ran (docs/PERFORMANCE.md); one read from its files takes ~0.05 s.
WORKER_PRELOAD_TOKENIZERS = env_bool("WORKER_PRELOAD_TOKENIZERS", True)
TRITON_MODEL_REPOSITORY = Path(env_str("TRITON_MODEL_REPOSITORY", str(BASE_DIR / "triton_models")))

# --- Placement ------------------------------------------------------------------------------------
FLEET_HEARTBEAT_INTERVAL_SECONDS = env_float("FLEET_HEARTBEAT_INTERVAL_SECONDS", 5.0)
# Long enough for a load to finish inside one run; a model load here takes ~15 s.
FLEET_RECONCILE_INTERVAL_SECONDS = env_float("FLEET_RECONCILE_INTERVAL_SECONDS", 10.0)
FLEET_RECONCILE_LOCK_SECONDS = env_float("FLEET_RECONCILE_LOCK_SECONDS", 300.0)
# How long a reconcile that failed on a database error keeps trying to give its lease back (a restart's length).
FLEET_RECONCILE_RELEASE_SECONDS = env_float("FLEET_RECONCILE_RELEASE_SECONDS", 30.0)
FLEET_PROBE_TIMEOUT_SECONDS = env_float("FLEET_PROBE_TIMEOUT_SECONDS", 2.0)
# Idle models keep their instances this long after their last work, then scale to min_instances.
FLEET_IDLE_TTL_SECONDS = env_float("FLEET_IDLE_TTL_SECONDS", 300.0)
# A new instance must pay back its load time within this horizon of serving the current backlog.
FLEET_PAYBACK_HORIZON_SECONDS = env_float("FLEET_PAYBACK_HORIZON_SECONDS", 60.0)
# Demand may move ±20 % around the current size before instances change: no thrash on noise.
FLEET_HYSTERESIS = env_float("FLEET_HYSTERESIS", 0.2)
# Longer than the dispatch route cache (1 s), so no new call is routed to a model being unloaded.
FLEET_UNLOAD_GRACE_SECONDS = env_float("FLEET_UNLOAD_GRACE_SECONDS", 1.5)
# Consolidation (fleet/consolidation.py): at most this many instance moves per payback horizon to make room
# for a model that fits nowhere, and a moved model stays put this long (no ping-pong).
FLEET_MAX_MOVES_PER_INTERVAL = env_int("FLEET_MAX_MOVES_PER_INTERVAL", 2, minimum=0)
FLEET_MOVE_COOLDOWN_SECONDS = env_float("FLEET_MOVE_COOLDOWN_SECONDS", 600.0)
FLEET_BREAKER_FAILURES = env_int("FLEET_BREAKER_FAILURES", 3, minimum=1)
FLEET_BREAKER_OPEN_SECONDS = env_float("FLEET_BREAKER_OPEN_SECONDS", 30.0)


# --- Fleet size, pools, registration --------------------------------------------------------------
def _fleet_scaling() -> FleetScaling:
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


FLEET_SCALING = _fleet_scaling()
