"""The routing table: which broker queue carries which task. Read by core/messaging/dispatch.py (every send) and by
settings.CELERY_TASK_ROUTES (beat's sends), so the two cannot disagree. No Django import: settings loads it."""

from __future__ import annotations

DEFAULT_QUEUE = "control"

# Slots go to their own queue so control work (validation, finalization, beat jobs) never waits behind a backlog
# of model work. Webhook attempts wait on tenants' receivers: a queue and a worker of their own, so a slow
# receiver never holds a control or shard thread.
TASK_QUEUES = {
    "scheduling.slot_run": "shards",
    "webhooks.deliver": "webhooks",
}


def queue_for(task_name: str) -> str:
    return TASK_QUEUES.get(task_name, DEFAULT_QUEUE)
