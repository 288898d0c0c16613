"""Delivering webhooks: one attempt of a delivery, its backoff, and the sweep that sends due deliveries.

Retries wait in the database (``next_attempt_at``), not in Celery countdowns: the beat task
``webhooks.deliveries_due`` sends a ``webhooks.deliver`` message for each delivery that is due, on the
``webhooks`` queue, whose own worker is the only one that ever waits on a receiver. An attempt claims its
delivery with a conditional UPDATE on the attempt count (the fencing token) and records its outcome only
if no later attempt was claimed since; every attempt, fenced or not, writes its row to the delivery log."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from controlplane.core.messaging import dispatch
from controlplane.core.observability import metrics
from controlplane.webhooks import inflight
from controlplane.webhooks.delivery import Outcome, post
from controlplane.webhooks.models import OPEN_STATUSES, DeliveryStatus, WebhookAttempt, WebhookDelivery
from controlplane.webhooks.services import signing_secrets
from controlplane.webhooks.urlguard import UrlPolicy

logger = logging.getLogger(__name__)

# While an attempt runs its delivery is not due for the attempt's deadline (WEBHOOK_TIMEOUT_SECONDS, enforced
# in delivery.post, DNS included) plus this margin for claiming and recording it: a thread still holding an
# attempt always finishes first, so only a dead worker's attempt is ever taken over. (Celery's time limits are
# no bound here: the webhooks worker's thread pool ignores them.)
ATTEMPT_LEASE_MARGIN = timedelta(seconds=60)
# The sweep sends a due delivery again only when its last message is this old (lost with a broker outage,
# or still queued behind slow receivers): a backlog is not multiplied by every sweep.
REQUEUE_AFTER = timedelta(seconds=30)
# Deliveries one sweep sends; the next sweep, seconds later, goes on.
SWEEP_BATCH = 500


def backoff(failed_attempts: int) -> timedelta:
    """The wait after the n-th failed attempt: WEBHOOK_BACKOFF_BASE_SECONDS doubling, capped at
    WEBHOOK_BACKOFF_MAX_SECONDS (5 s, 10 s, 20 s, … 1 h, then hourly until the window closes)."""
    exponent = min(max(failed_attempts - 1, 0), 32)  # 2**32 × 5 s is far past any cap
    seconds = min(settings.WEBHOOK_BACKOFF_BASE_SECONDS * 2**exponent, settings.WEBHOOK_BACKOFF_MAX_SECONDS)
    return timedelta(seconds=seconds)


def attempt_lease() -> timedelta:
    return timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS) + ATTEMPT_LEASE_MARGIN


def delivery_attempt(*, delivery_id: str, now: datetime) -> Outcome | None:
    """Attempt a due delivery once: POST the signed event, then mark it succeeded, failed (next attempt
    scheduled) or exhausted (the next one would fall after ``retry_until``). None when there was nothing to do:
    not due, closed, its endpoint disabled, or another worker claimed it first; and None, with the delivery
    deferred, when its endpoint or tenant already has its cap of attempts in flight in this process."""
    row = (
        WebhookDelivery.objects.filter(
            id=delivery_id, status__in=OPEN_STATUSES, next_attempt_at__lte=now, endpoint__enabled=True
        )
        .values("attempts", "endpoint_id", "endpoint__tenant_id")
        .first()
    )
    if row is None:
        return None
    caps = {
        f"endpoint:{row['endpoint_id']}": settings.WEBHOOK_MAX_INFLIGHT_PER_ENDPOINT,
        f"tenant:{row['endpoint__tenant_id']}": settings.WEBHOOK_MAX_INFLIGHT_PER_TENANT,
    }
    with inflight.DELIVERIES.hold(caps) as admitted:
        if not admitted:
            _defer(delivery_id=delivery_id, attempts=row["attempts"], now=now)
            return None
        return _attempt(delivery_id=delivery_id, attempts=row["attempts"], now=now)


def _defer(*, delivery_id: str, attempts: int, now: datetime) -> None:
    """Put a delivery back without spending an attempt: due again when one of its endpoint's attempts in
    flight has surely ended (their deadline), and sent again by the sweep (enqueued_at cleared)."""
    WebhookDelivery.objects.filter(
        id=delivery_id, status__in=OPEN_STATUSES, attempts=attempts, next_attempt_at__lte=now
    ).update(next_attempt_at=now + timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS), enqueued_at=None)
    logger.info("webhook %s: deferred, its endpoint or tenant has its cap of attempts in flight", delivery_id)


def _attempt(*, delivery_id: str, attempts: int, now: datetime) -> Outcome | None:
    number = attempts + 1
    claimed = WebhookDelivery.objects.filter(
        id=delivery_id, status__in=OPEN_STATUSES, attempts=attempts, next_attempt_at__lte=now
    ).update(attempts=number, next_attempt_at=now + attempt_lease(), last_attempt_at=now, enqueued_at=None)
    if claimed != 1:
        return None  # another worker (a duplicate message, the sweep) claimed this attempt first
    delivery = WebhookDelivery.objects.select_related("event", "endpoint").get(id=delivery_id)
    outcome = post(
        url=delivery.endpoint.url,
        body=delivery.event.body,
        webhook_id=delivery.id,
        signing_secrets=signing_secrets(delivery.endpoint, now=now),
        deadline_seconds=settings.WEBHOOK_TIMEOUT_SECONDS,
        policy=UrlPolicy.configured(),
    )
    _outcome_record(delivery, number=number, started_at=now, outcome=outcome)
    metrics.WEBHOOK_DELIVERIES.labels(outcome="succeeded" if outcome.ok else "failed").inc()
    return outcome


def _outcome_record(delivery: WebhookDelivery, *, number: int, started_at: datetime, outcome: Outcome) -> None:
    finished_at = started_at + timedelta(milliseconds=outcome.duration_ms)
    if outcome.ok:
        fields: dict[str, object] = {
            "status": DeliveryStatus.SUCCEEDED,
            "succeeded_at": finished_at,
            "next_attempt_at": None,
        }
    else:
        next_at = finished_at + backoff(number)
        if next_at > delivery.retry_until:
            fields = {"status": DeliveryStatus.EXHAUSTED, "next_attempt_at": None}
        else:
            fields = {"status": DeliveryStatus.FAILED, "next_attempt_at": next_at}
    with transaction.atomic():
        WebhookAttempt.objects.create(
            delivery_id=delivery.id,
            number=number,
            started_at=started_at,
            duration_ms=outcome.duration_ms,
            status_code=outcome.status_code,
            error=outcome.error,
            response_excerpt=outcome.response_excerpt,
        )
        recorded = (
            WebhookDelivery.objects.filter(id=delivery.id, attempts=number)
            .exclude(status=DeliveryStatus.DROPPED)  # housekeeping.py gave it up meanwhile: it stays dropped
            .update(last_status_code=outcome.status_code, last_error=outcome.error, **fields)
        )
    if recorded != 1:
        # A redeliver or a takeover after a lost lease claimed a newer attempt (its outcome is the one kept),
        # or the delivery was dropped while this attempt ran.
        logger.info("webhook %s: attempt %s finished after a newer attempt started or a drop", delivery.id, number)
    elif not outcome.ok:
        logger.info(
            "webhook %s attempt %s to %s failed: %s; now %s",
            delivery.id,
            number,
            delivery.endpoint_id,
            outcome.error,
            fields["status"],
        )


def deliveries_due_enqueue(*, now: datetime) -> int:
    """Send a deliver message for each due delivery (first attempts whose message was lost, retries,
    attempts of a worker that died) that has no recent message outstanding. Returns how many."""
    due = (
        WebhookDelivery.objects.filter(status__in=OPEN_STATUSES, next_attempt_at__lte=now, endpoint__enabled=True)
        .filter(Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - REQUEUE_AFTER))
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:SWEEP_BATCH]
    )
    with transaction.atomic():
        ids = list(due)
        WebhookDelivery.objects.filter(id__in=ids).update(enqueued_at=now)
        for delivery_id in ids:
            dispatch.webhook_deliver_enqueue(delivery_id)
    return len(ids)
