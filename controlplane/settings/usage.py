"""Settings of the usage ledger's attribution (usage/attribution.py; its beat entry is in __init__.py)."""

from __future__ import annotations

from controlplane.core.env import env_float

# How often beat reads each placement's Triton statistics and splits the growth across the shards that
# ran there. Shorter intervals tie busy time to the shards that caused it more closely (a shard runs
# ~0.25-1 s); each run costs one statistics call per placement, so 15 s keeps that negligible.
USAGE_ATTRIBUTION_INTERVAL_SECONDS = env_float(
    "USAGE_ATTRIBUTION_INTERVAL_SECONDS",
    15.0,
    help="How often beat splits each placement's Triton busy time across the shards that ran there.",
)
# A gap between two reads longer than this (beat was down) counts as this long for instance-seconds:
# nobody measured the placement in between, so idle capacity is not invented for the whole outage.
USAGE_ATTRIBUTION_MAX_GAP_SECONDS = env_float(
    "USAGE_ATTRIBUTION_MAX_GAP_SECONDS", 300.0, help="Longest gap between two reads counted as instance-seconds."
)
# Ledger rows older than this are left with their dispatch time: a placement read again after a long
# pause must not pour its busy time onto shards that finished long before.
USAGE_ATTRIBUTION_MAX_AGE_SECONDS = env_float(
    "USAGE_ATTRIBUTION_MAX_AGE_SECONDS",
    600.0,
    help="Ledger rows older than this keep their dispatch time instead of attributed busy time.",
)
# How often beat re-reads the month's ledger for the tenants with a spend cap (usage/spendcap.py): a tenant at its
# cap gets no more shards claimed, and its running batches end. A tenant may spend about this long's worth of
# its shards past its cap (with the shards already running); each run is one grouped read of the ledger.
SPEND_CAP_INTERVAL_SECONDS = env_float(
    "SPEND_CAP_INTERVAL_SECONDS",
    10.0,
    help="How often beat checks tenants' monthly spend caps and stops the batches of those at their cap.",
)
