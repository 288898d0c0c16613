"""Settings of Triton, the placement loop and the fleet-size loop (docs/architecture/placement.md,
docs/architecture/fleet-size.md).

The fleet-size loop's values are one typed object, ``FLEET_SCALING`` (fleet/sizing/types.FleetScaling);
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
TRITON_GRPC_URLS = env_list(
    "TRITON_GRPC_URLS",
    ["127.0.0.1:8011"],
    help="Triton gRPC addresses used while no server is registered (unmanaged; models load on first use).",
)
TRITON_TIMEOUT_SECONDS = env_float("TRITON_TIMEOUT_SECONDS", 120.0, help="Deadline of one Triton inference call.")
# Each prefork shard-worker process loads the enabled generation models' tokenizers in the background as it
# starts (controlplane/celery.py): a tokenizer that only transformers loads (kinds/generation/tokenizer.py) means
# importing transformers and torch, 3–5 s, up to 35 s on a loaded host, inside the first generation shard each
# process ran (docs/performance.md); one read from its files takes ~0.05 s.
WORKER_PRELOAD_TOKENIZERS = env_bool(
    "WORKER_PRELOAD_TOKENIZERS", True, help="Shard workers load the generation models' tokenizers as they start."
)
TRITON_MODEL_REPOSITORY = Path(
    env_str(
        "TRITON_MODEL_REPOSITORY",
        str(BASE_DIR / "triton_models"),
        help="The Triton model repository that the catalogue and the placement loop read model configurations from.",
    )
)

# --- Placement ------------------------------------------------------------------------------------
FLEET_HEARTBEAT_INTERVAL_SECONDS = env_float(
    "FLEET_HEARTBEAT_INTERVAL_SECONDS", 5.0, help="How often beat probes every Triton server's health."
)
# Long enough for a load to finish inside one run; a model load here takes ~15 s.
FLEET_RECONCILE_INTERVAL_SECONDS = env_float(
    "FLEET_RECONCILE_INTERVAL_SECONDS", 10.0, help="How often beat runs the placement loop (plan, then load/unload)."
)
FLEET_RECONCILE_LOCK_SECONDS = env_float(
    "FLEET_RECONCILE_LOCK_SECONDS", 300.0, help="Lease of one placement-loop run, taken over after it expires."
)
# A restart's length.
FLEET_RECONCILE_RELEASE_SECONDS = env_float(
    "FLEET_RECONCILE_RELEASE_SECONDS",
    30.0,
    help="How long a run that failed on a database error keeps trying to give its lease back.",
)
FLEET_PROBE_TIMEOUT_SECONDS = env_float("FLEET_PROBE_TIMEOUT_SECONDS", 2.0, help="Deadline of one health probe.")
FLEET_IDLE_TTL_SECONDS = env_float(
    "FLEET_IDLE_TTL_SECONDS", 300.0, help="Idle models keep their instances this long, then scale to min_instances."
)
FLEET_PAYBACK_HORIZON_SECONDS = env_float(
    "FLEET_PAYBACK_HORIZON_SECONDS",
    60.0,
    help="A new instance must pay back its load time within this much serving of the backlog.",
)
# No thrash on noise.
FLEET_HYSTERESIS = env_float(
    "FLEET_HYSTERESIS", 0.2, help="Fraction by which demand may move around a model's size before instances change."
)
# Longer than the dispatch route cache (1 s), so no new call is routed to a model being unloaded.
FLEET_UNLOAD_GRACE_SECONDS = env_float(
    "FLEET_UNLOAD_GRACE_SECONDS", 1.5, help="Wait between taking an instance out of routing and unloading it."
)
# Consolidation (fleet/placement/consolidation.py): at most this many instance moves per payback horizon to make room
# for a model that fits nowhere, and a moved model stays put this long (no ping-pong).
FLEET_MAX_MOVES_PER_INTERVAL = env_int(
    "FLEET_MAX_MOVES_PER_INTERVAL", 2, minimum=0, help="Instance moves per payback horizon to make room for a model."
)
FLEET_MOVE_COOLDOWN_SECONDS = env_float(
    "FLEET_MOVE_COOLDOWN_SECONDS", 600.0, help="A moved model stays where it is at least this long."
)
# An engine that sets no MAX_LORAS holds any number of adapters; this bounds what the reconciler keeps loaded there.
FLEET_ADAPTER_SLOTS = env_int(
    "FLEET_ADAPTER_SLOTS",
    0,
    minimum=0,
    help="LoRA adapters the reconciler keeps loaded per instance of a base whose engine sets no MAX_LORAS "
    "(0: no limit; an engine's MAX_LORAS below it wins).",
)
FLEET_BREAKER_FAILURES = env_int(
    "FLEET_BREAKER_FAILURES", 3, minimum=1, help="Failed calls in a row that open a placement's circuit breaker."
)
FLEET_BREAKER_OPEN_SECONDS = env_float(
    "FLEET_BREAKER_OPEN_SECONDS", 30.0, help="How long an open breaker keeps calls off its placement."
)


# --- Fleet size, pools, registration --------------------------------------------------------------
def _fleet_scaling() -> FleetScaling:
    raw = env_str(
        "FLEET_POOLS", "*=0:4", help="Each pool's MIN:MAX servers, e.g. default=0:4,a100=1:8; * for the rest."
    )
    try:
        pools, fallback = parse_pools(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"FLEET_POOLS: {exc}") from exc
    return FleetScaling(
        interval_s=env_float("FLEET_SIZE_INTERVAL_SECONDS", 10.0, help="How often beat plans the fleet's size."),
        pools=pools,
        default_limits=fallback or PoolLimits("*", 0, 4),
        drain_horizon_s=env_float(
            "FLEET_DRAIN_HORIZON_SECONDS",
            300.0,
            help="A backlog without a nearer deadline is planned to finish within this.",
        ),
        startup_s=env_float(
            "FLEET_STARTUP_SECONDS", 60.0, help="A new server's start (Triton, model loads) before it serves anything."
        ),
        headroom=env_float(
            "FLEET_SIZE_HEADROOM",
            0.8,
            help="Utilisation the fleet size is planned for (measured throughput is an average).",
        ),
        hysteresis=env_float(
            "FLEET_SIZE_HYSTERESIS", 0.2, help="Fraction by which the wanted size may move before servers change."
        ),
        scale_down_cooldown_s=env_float(
            "FLEET_SCALE_DOWN_COOLDOWN_SECONDS",
            300.0,
            help="A pool shrinks only after its need stayed below its size this long.",
        ),
        activation_work_s=env_float(
            "FLEET_ACTIVATION_WORK_SECONDS",
            0.0,
            help="Instance-seconds of backlog that wake a pool at zero (0: the first line does).",
        ),
        queue_ms_target=env_float(
            "FLEET_QUEUE_MS_TARGET", 500.0, help="Triton queue time per request (ms) that counts as saturated."
        ),
        gpu_utilization_target=env_float(
            "FLEET_GPU_UTILIZATION_TARGET", 0.9, help="GPU utilization above which a pool counts as saturated."
        ),
        worker_slots=env_int(
            "FLEET_WORKER_SLOTS", 4, minimum=1, help="A shard worker's concurrency (its --concurrency)."
        ),
        min_workers=env_int(
            "FLEET_MIN_WORKERS", 0, minimum=0, help="Fewest shard workers the fleet size plan asks for."
        ),
        max_workers=env_int(
            "FLEET_MAX_WORKERS", 16, minimum=0, help="Most shard workers the fleet size plan asks for."
        ),
        instances_per_server=env_int(
            "FLEET_INSTANCES_PER_SERVER",
            1,
            minimum=1,
            help="Model instances per server, for a pool with no registered server to count GPUs on.",
        ),
        token=env_str(
            "FLEET_TOKEN",
            "",
            help="Bearer token of the fleet's registration and drain endpoints; empty: they refuse (403).",
        ),
        drain_poll_s=env_float(
            "FLEET_DRAIN_POLL_SECONDS", 1.0, help="How often a waiting drain (manage.py fleet_drain) checks again."
        ),
    )


FLEET_SCALING = _fleet_scaling()
