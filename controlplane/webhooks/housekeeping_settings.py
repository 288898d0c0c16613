"""Settings of webhook housekeeping (housekeeping.py), read from the environment by that module. No beat
entry of its own: the batches' retention sweep (``batches.history_prune``, BATCH_RETENTION_INTERVAL_SECONDS,
hourly by default) runs it."""

from __future__ import annotations

from controlplane.core.env import env_int

# Closed deliveries (succeeded, exhausted, dropped) and their attempt log are deleted this long after they
# were created: the delivery log an operator reads while debugging an endpoint, kept as long as batch history
# (BATCH_RETENTION_DAYS' default) so one batch's story stays complete.
LOG_RETENTION_DAYS = env_int("WEBHOOK_LOG_RETENTION_DAYS", 30, minimum=1)
# Open deliveries (pending or failed, waiting to be retried) one endpoint may have; beyond it the oldest are
# dropped (status ``dropped``, counted in webhook_deliveries_dropped_total). A dead endpoint of a tenant that
# runs a batch a minute reaches ~1,440 in its 24 h retry window; 1,000 keeps the last ~17 h of its events.
MAX_OPEN_PER_ENDPOINT = env_int("WEBHOOK_MAX_OPEN_PER_ENDPOINT", 1000, minimum=1)
