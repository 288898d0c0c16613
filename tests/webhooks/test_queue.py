"""Deliver messages travel on their own ``webhooks`` queue (a real Redis broker the test starts), so a slow
receiver only ever holds that queue's worker, never the control or shard workers."""

from __future__ import annotations

import shutil

import pytest
from django.utils import timezone

from controlplane.webhooks import attempts, services
from tests.core.test_outbox import ThrowawayRedis, broker

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary"),
]


def test_deliveries_are_queued_on_the_webhooks_queue(tenant, loopback, broker, django_capture_on_commit_callbacks):
    broker.start()
    services.webhook_endpoint_create(tenant=tenant, url="http://127.0.0.1:9/hook")
    with django_capture_on_commit_callbacks(execute=True):
        ids = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_q", event_type="batch.completed")
    assert broker.queued("webhooks") == [("webhooks.deliver", ids)]
    assert broker.queued("control") == broker.queued("shards") == []
    with django_capture_on_commit_callbacks(execute=True):  # the sweep's re-send of a lost message, too
        attempts.deliveries_due_enqueue(now=timezone.now() + attempts.REQUEUE_AFTER * 2)
    assert broker.queued("webhooks") == [("webhooks.deliver", ids)] * 2


def test_a_broker_outage_loses_no_delivery(tenant, loopback, broker, django_capture_on_commit_callbacks):
    """The send fails (nothing listens), the row stays due, and the sweep sends it once the broker is back."""
    services.webhook_endpoint_create(tenant=tenant, url="http://127.0.0.1:9/hook")
    with django_capture_on_commit_callbacks(execute=True):
        ids = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_q", event_type="batch.completed")
    broker.start()
    assert broker.queued("webhooks") == []
    with django_capture_on_commit_callbacks(execute=True):
        assert attempts.deliveries_due_enqueue(now=timezone.now() + attempts.REQUEUE_AFTER * 2) == 1
    assert broker.queued("webhooks") == [("webhooks.deliver", ids)]
