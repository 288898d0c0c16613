"""Webhook housekeeping: a dead endpoint's waiting deliveries are capped (oldest dropped, counted), old closed
deliveries go with their attempt log and orphaned events, open ones and recent ones stay; the retention sweep
runs both."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.batches.tasks import history_prune_task
from controlplane.core.observability.metrics import WEBHOOK_DELIVERIES_DROPPED
from controlplane.webhooks import attempts, housekeeping, services
from controlplane.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def endpoints(tenant, loopback, messages):
    dead = services.webhook_endpoint_create(tenant=tenant, url="http://127.0.0.1:9/dead")
    alive = services.webhook_endpoint_create(tenant=tenant, url="http://127.0.0.1:9/alive")
    return dead, alive


def _emit(tenant, n: int, *, start: int = 0) -> None:
    for i in range(start, start + n):
        services.batch_event_emit(tenant_id=tenant.id, batch_id=f"batch_{i:03d}", event_type="batch.completed")


def _dropped_count() -> float:
    return WEBHOOK_DELIVERIES_DROPPED._value.get()


def test_an_endpoint_above_the_cap_loses_its_oldest_open_deliveries(tenant, endpoints):
    dead, alive = endpoints
    _emit(tenant, 7)
    # `alive` answered every one of them: only the dead endpoint has deliveries waiting.
    WebhookDelivery.objects.filter(endpoint=alive).update(status=DeliveryStatus.SUCCEEDED, next_attempt_at=None)
    # One of the dead endpoint's has failed once and waits for its retry: still open, still counts.
    oldest_failed = WebhookDelivery.objects.filter(endpoint=dead).order_by("created_at", "id")[1]
    WebhookDelivery.objects.filter(id=oldest_failed.id).update(status=DeliveryStatus.FAILED)
    before = _dropped_count()

    assert housekeeping.deliveries_cap(now=timezone.now(), cap=4) == 3

    by_age = list(WebhookDelivery.objects.filter(endpoint=dead).order_by("created_at", "id"))
    assert [d.status for d in by_age[:3]] == [DeliveryStatus.DROPPED] * 3
    assert all(d.status == DeliveryStatus.PENDING for d in by_age[3:])
    assert all(d.next_attempt_at is None and "more than 4" in d.last_error for d in by_age[:3])
    assert WebhookDelivery.objects.filter(endpoint=alive, status=DeliveryStatus.SUCCEEDED).count() == 7
    assert _dropped_count() == before + 3
    # At the cap: nothing more to do; and the sweep never sends a dropped delivery.
    assert housekeeping.deliveries_cap(now=timezone.now(), cap=4) == 0
    assert attempts.delivery_attempt(delivery_id=by_age[0].id, now=timezone.now()) is None


def test_an_attempt_that_was_running_when_its_delivery_was_dropped_leaves_it_dropped(tenant, endpoints, receiver):
    dead, _ = endpoints
    services.webhook_endpoint_update(endpoint=dead, url=receiver.url)
    _emit(tenant, 2)
    first = WebhookDelivery.objects.filter(endpoint=dead).order_by("created_at", "id").first()
    assert first is not None
    real_post = attempts.post

    def post_then_drop(**kwargs):
        outcome = real_post(**kwargs)
        housekeeping.deliveries_cap(now=timezone.now(), cap=1)  # the sweep ran while the receiver answered
        return outcome

    attempts.post = post_then_drop
    try:
        outcome = attempts.delivery_attempt(delivery_id=first.id, now=timezone.now())
    finally:
        attempts.post = real_post
    assert outcome is not None and outcome.ok
    first.refresh_from_db()
    assert first.status == DeliveryStatus.DROPPED
    assert WebhookAttempt.objects.filter(delivery=first).count() == 1  # the log still shows the attempt


def test_old_closed_deliveries_go_with_their_log_and_orphaned_events(tenant, endpoints, settings):
    dead, alive = endpoints
    _emit(tenant, 3)
    now = timezone.now()
    old = now - timedelta(days=settings.WEBHOOK_LOG_RETENTION_DAYS + 1)
    WebhookDelivery.objects.update(created_at=old)
    WebhookEvent.objects.update(created_at=old)
    WebhookDelivery.objects.filter(endpoint=alive).update(status=DeliveryStatus.SUCCEEDED)
    for delivery in WebhookDelivery.objects.filter(endpoint=alive):
        WebhookAttempt.objects.create(delivery=delivery, number=1, started_at=old, status_code=200)
    # Old but still open (a redeliver opened a new window): kept, and so is its event.
    open_one = WebhookDelivery.objects.filter(endpoint=dead).order_by("created_at", "id").first()
    assert open_one is not None
    WebhookDelivery.objects.filter(endpoint=dead).exclude(id=open_one.id).update(status=DeliveryStatus.EXHAUSTED)
    _emit(tenant, 1, start=10)  # a recent event, closed: kept
    WebhookDelivery.objects.filter(event__object_id="batch_010").update(status=DeliveryStatus.SUCCEEDED)

    pruned = housekeeping.delivery_log_prune(now=now)

    assert pruned == {"webhook_deliveries": 5, "webhook_events": 2}
    assert set(WebhookDelivery.objects.values_list("id", flat=True)) == {open_one.id} | set(
        WebhookDelivery.objects.filter(event__object_id="batch_010").values_list("id", flat=True)
    )
    assert WebhookAttempt.objects.count() == 0
    assert set(WebhookEvent.objects.values_list("object_id", flat=True)) == {open_one.event.object_id, "batch_010"}
    assert housekeeping.delivery_log_prune(now=now) == {"webhook_deliveries": 0, "webhook_events": 0}


def test_the_retention_sweep_runs_the_housekeeping(tenant, endpoints, settings):
    dead, _ = endpoints
    settings.WEBHOOK_MAX_OPEN_PER_ENDPOINT = 2
    _emit(tenant, 3)
    result = history_prune_task()
    # Three waiting on each endpoint, cap two: the oldest of each is dropped.
    assert result["webhook_deliveries_dropped"] == 2
    assert {"events", "shards", "webhook_deliveries", "webhook_events"} <= result.keys()
    assert WebhookDelivery.objects.filter(endpoint=dead, status=DeliveryStatus.DROPPED).count() == 1
