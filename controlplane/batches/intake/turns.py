"""Validation's turn: at most VALIDATION_MAX_PER_TENANT batches of one tenant validate at once, and one past the limit
gives its place in the validation queue to whatever is behind it.

A validate message takes its batch's turn in one short transaction: the batch row (as every validation writer locks
it first), then the tenant row, so two claims of one tenant are counted one after the other. A batch of the tenant
validating is one in ``validating`` with ``validation_started_at`` set. Under the limit, the batch takes the turn and
its next attempt number (early_dispatch.validation_attempt_begin: the fencing that keeps validation exactly-once).
At the limit, it gives its turn back: the same message is enqueued again through the outbox, in the same transaction
(so it cannot be lost), WAIT_SECONDS later, at the back of the queue, so another tenant's validation behind it runs
first. ``validation_waiting_at`` records each give-back: the rescuer's deadline (validation_rescue.py) counts from
it, so a batch that waits its turn for longer than the deadline is not taken for lost.

When a validation ends, the tenant's oldest waiting batch is sent a message at once (``validation_turn_pass``), so
a tenant's batches follow one another without waiting out WAIT_SECONDS. A batch may then hold two messages, its own
going round and the hand-off: both are *waiting* messages, which only take the turn of a batch that has none, so
the second finds the turn taken and drops out instead of superseding the attempt the first began. Any other message
(create, the rescuer's retry, a redelivery after a lost worker) takes a new attempt, as before.

Why the messages go round rather than a claim of "the fairest waiting batch": a message names its batch, so a
waiting batch needs no other process to wake it, and the hand-off only makes it sooner. The price is one small
transaction every WAIT_SECONDS per waiting batch."""

from __future__ import annotations

from typing import Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.batches.intake.early_dispatch import validation_attempt_begin
from controlplane.batches.models import Batch, BatchStatus
from controlplane.core.messaging import dispatch
from controlplane.tenants.models import Tenant

# The backstop of the hand-off: long enough that a waiting message does not spin through the queue.
WAIT_SECONDS = 2.0
WAIT: Literal["wait"] = "wait"


def validation_turn_take(*, batch_id: str, waiting: bool = False) -> int | Literal["wait"] | None:
    """The attempt number of this batch's validation when it may run now; WAIT when its tenant is at the limit (its
    message is enqueued again, after this transaction); None when the batch is no longer validating, or when this
    is a ``waiting`` message and another message took the batch's turn already."""
    with transaction.atomic():
        row = (
            Batch.objects.select_for_update()
            .filter(id=batch_id, status=BatchStatus.VALIDATING)
            .values("tenant_id", "validation_started_at")
            .first()
        )
        if row is None or (waiting and row["validation_started_at"] is not None):
            return None
        # NO KEY UPDATE: serializes the claims (and admissions) of one tenant, not the foreign-key checks of its rows.
        list(Tenant.objects.select_for_update(no_key=True).filter(id=row["tenant_id"]).values_list("id"))
        validating = (
            Batch.objects.filter(
                tenant_id=row["tenant_id"], status=BatchStatus.VALIDATING, validation_started_at__isnull=False
            )
            .exclude(id=batch_id)
            .count()
        )
        now = timezone.now()
        if validating >= settings.VALIDATION_MAX_PER_TENANT:
            Batch.objects.filter(id=batch_id).update(validation_started_at=None, validation_waiting_at=now)
            dispatch.batch_validate_enqueue(batch_id, countdown=WAIT_SECONDS, waiting=True)
            return WAIT
        if row["validation_started_at"] is None:
            # Kept by a redelivered message of a batch already validating: its deadline's clock does not restart.
            Batch.objects.filter(id=batch_id).update(validation_started_at=now)
        return validation_attempt_begin(batch_id=batch_id)


def validation_turn_pass(*, tenant_id: int) -> None:
    """A validation of the tenant ended: its oldest waiting batch is sent a waiting message now (it takes the turn if
    the tenant is under the limit, else goes round as its own message does)."""
    with transaction.atomic():
        waiting = (
            Batch.objects.filter(
                tenant_id=tenant_id,
                status=BatchStatus.VALIDATING,
                validation_started_at__isnull=True,
                validation_waiting_at__isnull=False,
            )
            .order_by("created_at")
            .values_list("id", flat=True)
            .first()
        )
        if waiting is not None:
            dispatch.batch_validate_enqueue(waiting, waiting=True)
