"""Settings of the scheduler (docs/architecture/scheduling.md): the policy, shard sizing, and the slots
that cap Triton calls in flight. The top-up's beat entry is in __init__.py."""

from __future__ import annotations

from controlplane.core.env import env_choice, env_float, env_int

SCHEDULER_POLICY = env_choice(
    "SCHEDULER_POLICY",
    "fair",
    ("fair", "fifo"),
    help="fair: priority classes, weighted fair share, deadlines; fifo: oldest first (the fairness bench's baseline).",
)
# A running shard cannot be preempted, so a newcomer waits at most about one shard per slot: 0.25–1 s keeps
# per-shard overhead small and waits short. 1 s, the top of that range: measured on MiniLM (CPU), 0.5 s shards of
# ~10 lines made the 100-line batch 2.6 s instead of 1.9 s (calls too small to batch); tensor floods hit
# SHARD_MAX_LINES first anyway.
SCHEDULER_SHARD_SECONDS = env_float("SCHEDULER_SHARD_SECONDS", 1.0, help="Measured model time a shard is cut to.")
SCHEDULER_SHARD_MIN_LINES = env_int("SCHEDULER_SHARD_MIN_LINES", 4, minimum=1, help="Fewest lines in a shard.")
# Bounded wait.
SCHEDULER_AGING_SECONDS = env_float(
    "SCHEDULER_AGING_SECONDS", 600.0, help="A normal or low batch not served this long is served before every class."
)
SCHEDULER_HALF_LIFE_SECONDS = env_float(
    "SCHEDULER_HALF_LIFE_SECONDS", 3600.0, help="Half-life of the usage behind the fair share: a tenant's lead fades."
)
SCHEDULER_DEADLINE_FRACTION = env_float(
    "SCHEDULER_DEADLINE_FRACTION",
    0.5,
    help="A batch whose remaining work needs more than this fraction of its time left is promoted.",
)
# Two shards of DISPATCH_INFLIGHT_CALLS calls keep an instance's dynamic batcher fed.
SCHEDULER_CALLS_PER_INSTANCE = env_int(
    "SCHEDULER_CALLS_PER_INSTANCE",
    6,
    minimum=1,
    help="Triton calls in flight per ready instance (a model's max_inflight_calls overrides).",
)
# Short is safe: a message that arrives after its slot expired does nothing, so an early expiry costs one extra
# message, never an extra shard in flight.
SCHEDULER_SLOT_QUEUED_SECONDS = env_float(
    "SCHEDULER_SLOT_QUEUED_SECONDS",
    20.0,
    help="A queued slot whose message was lost (or whose worker died) stops counting against the cap after this.",
)
# So one model's backlog never holds every worker thread.
SCHEDULER_SLOT_BUDGET_SECONDS = env_float(
    "SCHEDULER_SLOT_BUDGET_SECONDS",
    10.0,
    help="A slot runs shards back to back this long at most, then hands its place back to the broker.",
)
# The other top-ups are event-driven.
SCHEDULER_TOPUP_INTERVAL_SECONDS = env_float(
    "SCHEDULER_TOPUP_INTERVAL_SECONDS", 2.0, help="How often beat tops up every model's slots."
)
