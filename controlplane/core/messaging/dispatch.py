"""The one place that puts messages on the broker.

Services never import task modules (tasks import services): they name the task here, and the message
is sent after the surrounding transaction commits, so a worker never sees a row that is not there yet.
Postgres holds the queue; the broker carries only these few kinds of message.

Two kinds of delivery:
- *durable* (validate, finalize): an OutboxMessage row is written in the caller's transaction, so "the
  batch changed" and "its work will be dispatched" commit together. After commit we send and delete the
  row; if the broker is down the row stays and ``outbox_relay`` (a beat task) sends it once the broker is
  back. A broker outage at batch create therefore delays validation, never loses it, and never turns a
  committed create into a 500.
- *regenerable* (slot top-ups, slots, webhook deliveries, a reconcile asked for now): their state is already in Postgres (Slot rows,
  runnable shards, WebhookDelivery rows with their next_attempt_at) and beat re-derives them every few
  seconds, so a failed send is logged and dropped.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery import current_app
from django.db import transaction
from django.utils import timezone

from controlplane.core.messaging.queues import queue_for
from controlplane.core.models import OutboxMessage

logger = logging.getLogger(__name__)

VALIDATE = "batches.batch_validate"
FINALIZE = "batches.batch_finalize"
TOPUP = "scheduling.slots_topup"
SLOT = "scheduling.slot_run"
WEBHOOK_DELIVER = "webhooks.deliver"
FLEET_RECONCILE = "fleet.reconcile"

# A short publish retry: a broker blip is absorbed here, a real outage falls through to the outbox
# (or to beat's regeneration) within a second instead of blocking the request that committed.
_PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2}
# The relay leaves younger rows to their own after-commit send, which normally deletes them first.
RELAY_GRACE = timedelta(seconds=2)
# Bounded per run: a long outage's backlog drains over a few beats rather than in one long task.
RELAY_BATCH = 500


def send(task_name: str, args: list[Any], **options: Any) -> None:
    """Publish now (tests replace this to drive the services by hand). ``options``: Celery's, e.g. a countdown."""
    current_app.send_task(
        task_name,
        args=args,
        queue=queue_for(task_name),
        retry=True,
        retry_policy=_PUBLISH_RETRY,
        **options,
    )


def broker_warm() -> None:
    """Load Celery's app and open this process's broker connection before a request needs them: the first publish
    of a web process took ~0.3 s (the task modules' import, the transport's, the connection), and paid it on the
    request that created a batch, whose validation then started that much later. A broker that is down is logged
    and left to the first send, which has the outbox behind it."""
    try:
        current_app.loader.import_default_modules()
        with current_app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001 - an optimisation: the web serves without it
        logger.warning("broker not reached at start-up (the first send will connect): %s", exc)


def _send_or_log(task_name: str, args: list[Any], **options: Any) -> bool:
    try:
        send(task_name, args, **options)
    except Exception as exc:  # noqa: BLE001 - any publish failure means "the broker did not take it"
        logger.warning("broker did not take %s%s: %s", task_name, args, exc)
        return False
    return True


def _regenerable(task_name: str, args: list[Any]) -> None:
    transaction.on_commit(lambda: _send_or_log(task_name, args))


def _durable(task_name: str, args: list[Any], **options: Any) -> None:
    # The relay sends a row without its options: a message the broker first refused goes out at once.
    message = OutboxMessage.objects.create(task_name=task_name, args=args)

    def publish() -> None:
        if _send_or_log(task_name, args, **options):
            OutboxMessage.objects.filter(id=message.id).delete()

    transaction.on_commit(publish)


def outbox_relay(*, now: Any = None) -> int:
    """Send the outbox rows whose after-commit send failed; returns how many went out. Stops at the
    first failure: the broker is still down, and the rest would fail the same way."""
    cutoff = (now or timezone.now()) - RELAY_GRACE
    sent = 0
    with transaction.atomic():
        pending = list(
            OutboxMessage.objects.select_for_update(skip_locked=True)
            .filter(created_at__lte=cutoff)
            .order_by("id")[:RELAY_BATCH]
        )
        for message in pending:
            try:
                send(message.task_name, message.args)
            except Exception as exc:  # noqa: BLE001 - recorded on the row, shown in the admin
                OutboxMessage.objects.filter(id=message.id).update(
                    attempts=message.attempts + 1, last_error=str(exc)[:2000]
                )
                logger.warning("outbox relay: broker still refuses %s: %s", message, exc)
                break
            message.delete()
            sent += 1
    return sent


def batch_validate_enqueue(batch_id: str, *, countdown: float | None = None, waiting: bool = False) -> None:
    """``waiting``: a message of a batch waiting its validation turn (batches/intake/turns.py), which takes the turn
    only if no other message did; ``countdown``: it comes round again that much later."""
    args: list[Any] = [batch_id, True] if waiting else [batch_id]
    if countdown is None:
        _durable(VALIDATE, args)
    else:
        _durable(VALIDATE, args, countdown=countdown)


def batch_finalize_enqueue(batch_id: str, *, taken: bool = False) -> None:
    """``taken``: the sender moved the batch into finalizing itself (the rescuer): the task finalizes it."""
    _durable(FINALIZE, [batch_id, True] if taken else [batch_id])


def slots_topup_enqueue(model_name: str | None = None) -> None:
    """Ask the dispatcher to top up a model's slots (every model's when None)."""
    _regenerable(TOPUP, [model_name])


def slot_enqueue(slot_id: int) -> None:
    _regenerable(SLOT, [slot_id])


def webhook_deliver_enqueue(delivery_id: str) -> None:
    """Attempt a webhook delivery now. Regenerable, not durable: the WebhookDelivery row, written in the
    same transaction, is the durable record, and beat's webhooks.deliveries_due sends any due delivery
    whose message went missing (webhooks/attempts.py); an outbox row would only duplicate it."""
    _regenerable(WEBHOOK_DELIVER, [delivery_id])


def fleet_reconcile_now(*, actor: str) -> str | None:
    """Reconcile the fleet now instead of at beat's next tick (a drain waits on it; an operator pressed
    "rebalance"). Sent at once, not after a commit: it changes no row of the caller's. Returns None when the
    broker took it, else the broker's error (logged); without a broker, beat's tick still reconciles."""
    try:
        send(FLEET_RECONCILE, [actor])
    except Exception as exc:  # noqa: BLE001 - any publish failure means "the broker did not take it"
        logger.warning("broker did not take %s for %s: %s", FLEET_RECONCILE, actor, exc)
        return str(exc)
    return None
