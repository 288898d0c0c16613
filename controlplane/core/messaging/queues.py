"""The routing table: which broker queue carries which task. Read by core/messaging/dispatch.py (every send) and by
settings.CELERY_TASK_ROUTES (beat's sends), so the two cannot disagree. No Django import: settings loads it."""

from __future__ import annotations

# Per-batch tenant work that is not validation: finalize (a cancel, an expiry, a finalizer that died).
DEFAULT_QUEUE = "control"
VALIDATION_QUEUE = "validation"
HOUSEKEEPING_QUEUE = "housekeeping"

# Every queue has its own worker, so no queue's backlog delays another's work:
# - validation: CPU-bound parsing of tenants' files, on a process pool; one tenant's huge file holds one process;
# - housekeeping: beat's jobs (and the top-ups and reconciles services ask for), which no tenant's work can fill;
# - shards: the scheduler's slots (model work);
# - webhooks: attempts that wait on tenants' receivers.
TASK_QUEUES = {
    "batches.batch_validate": VALIDATION_QUEUE,
    "scheduling.slot_run": "shards",
    "webhooks.deliver": "webhooks",
    # Beat's schedule (settings CELERY_BEAT_SCHEDULE; tests/core/test_queues.py holds it to this list).
    "batches.shards_rescue": HOUSEKEEPING_QUEUE,
    "batches.batches_expire": HOUSEKEEPING_QUEUE,
    "batches.spend_caps_enforce": HOUSEKEEPING_QUEUE,
    "batches.files_expire": HOUSEKEEPING_QUEUE,
    "batches.history_prune": HOUSEKEEPING_QUEUE,
    "batches.storage_collect": HOUSEKEEPING_QUEUE,
    "scheduling.slots_topup": HOUSEKEEPING_QUEUE,
    "fleet.heartbeat": HOUSEKEEPING_QUEUE,
    "fleet.reconcile": HOUSEKEEPING_QUEUE,
    "fleet.size_plan": HOUSEKEEPING_QUEUE,
    "core.outbox_relay": HOUSEKEEPING_QUEUE,
    "core.idempotency_records_prune": HOUSEKEEPING_QUEUE,
    "webhooks.deliveries_due": HOUSEKEEPING_QUEUE,
    "usage.attribute": HOUSEKEEPING_QUEUE,
    "console.samples_take": HOUSEKEEPING_QUEUE,
}
QUEUES = (DEFAULT_QUEUE, VALIDATION_QUEUE, HOUSEKEEPING_QUEUE, "shards", "webhooks")


def queue_for(task_name: str) -> str:
    return TASK_QUEUES.get(task_name, DEFAULT_QUEUE)
