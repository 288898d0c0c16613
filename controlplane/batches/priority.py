"""An operator action on the queue: a batch's priority class. It writes a batch row, so it lives with the
batches (pausing a tenant lives in tenants.services, pausing a model in fleet.services: each app writes its
own rows); the admin's queue page (scheduling) and the batch admin both call it.

Each such action commits its change with an audit row (a BatchEvent, the tenant's TenantEvent, or a PlacementEvent
for a catalogue model) and then asks the dispatcher for a top-up (core.messaging.dispatch, sent after commit), so
the change takes effect at once instead of at the next beat. For a pause the top-up creates nothing (a
paused tenant's or model's shards are not runnable), but one rule for every action is simpler than
deciding per action, and a top-up costs one message."""

from __future__ import annotations

import logging

from django.db import transaction

from controlplane.batches.models import Batch, BatchStatus
from controlplane.batches.transitions import event_record
from controlplane.core.http.errors import Conflict, NotFound, ValidationFailed
from controlplane.core.messaging import dispatch
from controlplane.tenants.models import Priority

logger = logging.getLogger(__name__)

# Priority still matters while the batch waits to validate or has shards to run.
_PRIORITY_STATUSES = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


def batch_priority_set(*, batch_id: str, priority: str, actor: str) -> bool:
    """Move a live batch to another priority class. Operators may set any class: the tenant's
    ``max_priority`` limits only what the API accepts. Returns whether anything changed; only a change
    writes a BatchEvent. A batch that is stopping or finished raises Conflict."""
    if priority not in Priority.values:
        raise ValidationFailed(f"priority must be one of {Priority.values}, got {priority!r}.", param="priority")
    with transaction.atomic():
        batch = (
            Batch.objects.select_for_update()
            .filter(id=batch_id)
            .values("status", "stop_reason", "priority", "model")
            .first()
        )
        if batch is None:
            raise NotFound(f"No batch {batch_id!r}.", param="batch_id")
        if batch["status"] not in _PRIORITY_STATUSES or batch["stop_reason"]:
            raise Conflict(f"Batch {batch_id} is {batch['status']}: its priority no longer matters.", param="batch_id")
        if batch["priority"] == priority:
            return False
        Batch.objects.filter(id=batch_id).update(priority=priority)
        event_record(batch_id=batch_id, kind="priority_changed", message=f"{batch['priority']} → {priority} by {actor}")
        if batch["model"]:  # known once validated; a validating batch has nothing to dispatch yet
            dispatch.slots_topup_enqueue(batch["model"])
    return True
