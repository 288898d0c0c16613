"""Settings of the operators' console (dashboards, samples: console/samples.py; the beat entry is in
__init__.py)."""

from __future__ import annotations

from controlplane.core.env import env_float, env_int

# How often beat stores a sample: 15 s resolves a shard-sized burst on the 1 h chart (240 points) and costs a
# handful of grouped queries, a few rows per model, per tick.
CONSOLE_SAMPLES_INTERVAL_SECONDS = env_float("CONSOLE_SAMPLES_INTERVAL_SECONDS", 15.0)
# Samples older than this are pruned by the same task: the longest dashboard window (7 d) plus a day.
CONSOLE_SAMPLES_RETENTION_DAYS = env_int("CONSOLE_SAMPLES_RETENTION_DAYS", 8, minimum=1)
