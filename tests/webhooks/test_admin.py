"""Operators' view: register an endpoint (the API's URL check, the secret shown once), the delivery log,
each delivery's attempts, and the redeliver action."""

from __future__ import annotations

import pytest

# Admin URLs escape "_" in primary keys (batch_…, wh_…): the raw id can decode to another one.
from django.contrib.admin.utils import quote as admin_quote
from django.utils import timezone

from controlplane.core.messaging import dispatch
from controlplane.webhooks import attempts, services
from controlplane.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

ALL_TYPES = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


def test_an_operator_registers_an_endpoint(admin_client, tenant, loopback, receiver):
    form = {
        "tenant": tenant.id,
        "name": "ops",
        "url": "http://10.0.0.5/hook",
        "event_types": ALL_TYPES,
        "enabled": "on",
    }
    refused = admin_client.post("/admin/webhooks/webhookendpoint/add/", form)
    assert refused.status_code == 200 and b"a private address" in refused.content
    assert not WebhookEndpoint.objects.exists()

    created = admin_client.post("/admin/webhooks/webhookendpoint/add/", {**form, "url": receiver.url}, follow=True)
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret.startswith("whsec_") and endpoint.secret.encode() in created.content  # shown once
    assert (endpoint.tenant_id, endpoint.url, endpoint.event_types) == (tenant.id, receiver.url, ALL_TYPES)
    page = admin_client.get(f"/admin/webhooks/webhookendpoint/{admin_quote(endpoint.id)}/change/")
    assert page.status_code == 200 and endpoint.secret.encode() not in page.content  # only a hint afterwards

    paused = {**form, "url": receiver.url, "event_types": ["batch.failed"]}
    del paused["enabled"]
    admin_client.post(f"/admin/webhooks/webhookendpoint/{admin_quote(endpoint.id)}/change/", paused)
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.event_types) == (False, ["batch.failed"])


def test_the_delivery_log_and_redeliver(
    admin_client, tenant, loopback, receiver, messages, django_capture_on_commit_callbacks
):
    endpoint = services.webhook_endpoint_create(tenant=tenant, url=receiver.url)
    [delivery_id] = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_adm", event_type="batch.failed")
    attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())

    log = admin_client.get(f"/admin/webhooks/webhookdelivery/?endpoint__id__exact={endpoint.id}")
    assert log.status_code == 200 and delivery_id.encode() in log.content and b"batch_adm" in log.content
    detail = admin_client.get(f"/admin/webhooks/webhookdelivery/{admin_quote(delivery_id)}/change/")
    assert detail.status_code == 200 and b"batch.failed" in detail.content and b"200" in detail.content
    assert admin_client.get("/admin/webhooks/webhookendpoint/").status_code == 200

    messages.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/admin/webhooks/webhookdelivery/", {"action": "redeliver", "_selected_action": [delivery_id]}
        )
    assert response.status_code == 302
    assert messages == [(dispatch.WEBHOOK_DELIVER, [delivery_id])]
    assert WebhookDelivery.objects.get(id=delivery_id).status == DeliveryStatus.PENDING
    attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    assert [r.headers["webhook-id"] for r in receiver.requests] == [delivery_id, delivery_id]
