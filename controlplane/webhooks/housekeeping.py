"""Webhook housekeeping, run by the batches' retention sweep (``batches.history_prune``, hourly):

- ``deliveries_cap``: an endpoint with more than WEBHOOK_MAX_OPEN_PER_ENDPOINT open deliveries (a receiver
  that has been dead for a day while its tenant's batches keep finishing) has its oldest open ones dropped:
  status ``dropped``, no more attempts, counted in ``webhook_deliveries_dropped_total``. The table then
  holds at most the cap per endpoint plus what one sweep interval adds.
- ``delivery_log_prune``: closed deliveries (succeeded, exhausted, dropped) older than
  WEBHOOK_LOG_RETENTION_DAYS go with their attempt log, then the events no delivery refers to any more.

Both are bounded per run and delete or update in small chunks, each its own short statement, like
batches/results/retention.py."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, QuerySet
from django.utils import timezone

from controlplane.core.observability import metrics
from controlplane.webhooks.models import OPEN_STATUSES, DeliveryStatus, WebhookDelivery, WebhookEvent

logger = logging.getLogger(__name__)

CLOSED_STATUSES = (DeliveryStatus.SUCCEEDED, DeliveryStatus.EXHAUSTED, DeliveryStatus.DROPPED)
# Rows per statement: a short transaction each, and few statements.
CHUNK = 1000
# Rows of each kind one run deletes at most, so a run ends in seconds; the next run goes on.
PRUNE_ROWS_PER_RUN = 100_000


def deliveries_cap(*, now: datetime, cap: int | None = None) -> int:
    """Drop the oldest open deliveries of every endpoint above ``cap`` (WEBHOOK_MAX_OPEN_PER_ENDPOINT) open
    ones. Returns how many were dropped. An attempt already running on a dropped delivery still finishes,
    but its outcome no longer changes the delivery (attempts.py records only on open ones)."""
    limit = settings.WEBHOOK_MAX_OPEN_PER_ENDPOINT if cap is None else cap
    over = (
        WebhookDelivery.objects.filter(status__in=OPEN_STATUSES)
        .values("endpoint_id")
        .annotate(open=Count("id"))
        .filter(open__gt=limit)
    )
    dropped = 0
    for row in over:
        excess = row["open"] - limit
        while excess > 0:
            ids = list(
                WebhookDelivery.objects.filter(endpoint_id=row["endpoint_id"], status__in=OPEN_STATUSES)
                .order_by("created_at", "id")
                .values_list("id", flat=True)[: min(excess, CHUNK)]
            )
            if not ids:
                break
            # Conditional: a delivery that succeeded meanwhile stays succeeded.
            done = WebhookDelivery.objects.filter(id__in=ids, status__in=OPEN_STATUSES).update(
                status=DeliveryStatus.DROPPED,
                next_attempt_at=None,
                last_error=f"dropped: the endpoint had more than {limit} deliveries waiting",
            )
            dropped += done
            excess -= len(ids)
        logger.warning("webhook endpoint %s: dropped its oldest open deliveries above %d", row["endpoint_id"], limit)
    if dropped:
        metrics.WEBHOOK_DELIVERIES_DROPPED.inc(dropped)
    return dropped


def delivery_log_prune(*, now: datetime, limit: int = PRUNE_ROWS_PER_RUN) -> dict[str, int]:
    """Delete closed deliveries created more than WEBHOOK_LOG_RETENTION_DAYS before ``now`` (their attempts
    go with them), then events as old that no delivery refers to. Returns the counts."""
    cutoff = now - timedelta(days=settings.WEBHOOK_LOG_RETENTION_DAYS)
    deliveries = _delete_in_chunks(
        WebhookDelivery.objects.filter(status__in=CLOSED_STATUSES, created_at__lt=cutoff), limit=limit
    )
    events = _delete_in_chunks(
        WebhookEvent.objects.filter(created_at__lt=cutoff).exclude(id__in=WebhookDelivery.objects.values("event_id")),
        limit=limit,
    )
    pruned = {"webhook_deliveries": deliveries, "webhook_events": events}
    if deliveries or events:
        logger.info("pruned webhook delivery log: %s", pruned)
    return pruned


def webhooks_housekeep(*, now: datetime | None = None) -> dict[str, int]:
    """Both, for the retention sweep."""
    at = now or timezone.now()
    return {"webhook_deliveries_dropped": deliveries_cap(now=at), **delivery_log_prune(now=at)}


def _delete_in_chunks(rows: QuerySet[WebhookDelivery] | QuerySet[WebhookEvent], *, limit: int) -> int:
    deleted = 0
    while deleted < limit:
        ids = list(rows.order_by("pk").values_list("pk", flat=True)[: min(CHUNK, limit - deleted)])
        if not ids:
            break
        rows.model.objects.filter(pk__in=ids).delete()
        deleted += len(ids)
    return deleted
