"""Thin Celery tasks. ``webhooks.deliver`` runs on the ``webhooks`` queue (core/dispatch.py), so a slow or
failing receiver only ever holds that queue's worker; the sweep is a short query and runs on ``control``."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from controlplane.core.logs import log_context_bind
from controlplane.webhooks import attempts


# One POST with WEBHOOK_TIMEOUT_SECONDS (10 s) on connect and each read: 60 s is a receiver that trickles
# its answer; the hard limit (90 s) stays below attempts.ATTEMPT_LEASE (120 s).
@shared_task(name="webhooks.deliver", soft_time_limit=60, time_limit=90)
def deliver_task(delivery_id: str) -> int | None:
    log_context_bind(webhook_delivery_id=delivery_id)
    outcome = attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    return None if outcome is None else outcome.status_code


@shared_task(name="webhooks.deliveries_due")
def deliveries_due_task() -> int:
    return attempts.deliveries_due_enqueue(now=timezone.now())
