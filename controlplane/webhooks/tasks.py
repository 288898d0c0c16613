"""Thin Celery tasks. ``webhooks.deliver`` runs on the ``webhooks`` queue (core/messaging/dispatch.py), so a slow or
failing receiver only ever holds that queue's worker; the sweep is a short query and runs on ``control``."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.core.observability.logs import log_context_bind
from controlplane.webhooks import attempts


# No Celery time limit: the webhooks worker runs the thread pool, which ignores them. The bound is in the code:
# one attempt ends within WEBHOOK_TIMEOUT_SECONDS (delivery.post), and its lease outlasts that (attempts.py).
@shared_task(name="webhooks.deliver")
def deliver_task(delivery_id: str) -> int | None:
    log_context_bind(webhook_delivery_id=delivery_id)
    outcome = attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    return None if outcome is None else outcome.status_code


@shared_task(name="webhooks.deliveries_due")
def deliveries_due_task() -> int:
    return attempts.deliveries_due_enqueue(now=timezone.now())
