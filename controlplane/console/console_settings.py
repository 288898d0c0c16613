"""Settings of the operators' console (dashboards, samples), read from the environment. settings.py merges
BEAT_SCHEDULE into CELERY_BEAT_SCHEDULE; the rest is read from here by the console's own modules."""

from __future__ import annotations

from datetime import timedelta

from controlplane.core.env import env_float, env_int

# How often beat stores a sample: 15 s resolves a shard-sized burst on the 1 h chart (240 points) and costs a
# handful of grouped queries, a few rows per model, per tick.
SAMPLES_INTERVAL_SECONDS = env_float("CONSOLE_SAMPLES_INTERVAL_SECONDS", 15.0)
# Samples older than this are pruned by the same task: the longest dashboard window (7 d) plus a day.
SAMPLES_RETENTION_DAYS = env_int("CONSOLE_SAMPLES_RETENTION_DAYS", 8, minimum=1)

BEAT_SCHEDULE = {
    "console-samples": {"task": "console.samples_take", "schedule": timedelta(seconds=SAMPLES_INTERVAL_SECONDS)},
}
