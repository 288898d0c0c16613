"""The webhook endpoint API with the official openai SDK (client.webhooks.*), the refusal of private
addresses, tenant scoping and the delivery log (an extension)."""

from __future__ import annotations

import openai
import pytest
from rest_framework.test import APIClient

from controlplane.webhooks import attempts, services
from controlplane.webhooks.models import EVENT_TYPES, WebhookEndpoint
from controlplane.webhooks.urlguard import address_refusal
from tests.webhooks.conftest import unwrap

pytestmark = pytest.mark.django_db


def test_the_sdk_manages_endpoints(sdk, tenant, loopback, receiver):
    created = sdk.webhooks.create(url=receiver.url, name="prod", event_types=["batch.completed", "batch.failed"])
    assert isinstance(created, openai.types.webhooks.WebhookEndpointWithSecret)
    assert created.signing_secret.startswith("whsec_") and created.id.startswith("we_")
    assert created.signing_secret_hint == "whsec_…" + created.signing_secret[-4:]
    assert (created.url, created.name, created.event_types) == (
        receiver.url,
        "prod",
        ["batch.completed", "batch.failed"],
    )

    fetched = sdk.webhooks.retrieve(created.id)
    assert fetched.id == created.id and not hasattr(fetched, "signing_secret")  # shown once, on create
    assert [e.id for e in sdk.webhooks.list()] == [created.id]
    updated = sdk.webhooks.update(created.id, name="renamed", event_types=["batch.expired"])
    assert (updated.name, updated.event_types, updated.url) == ("renamed", ["batch.expired"], receiver.url)
    assert sdk.webhooks.event_types.list().data == list(EVENT_TYPES)

    rotated = sdk.webhooks.rotate_secret(created.id)
    assert rotated.signing_secret != created.signing_secret
    result = sdk.webhooks.test(created.id, event_type="batch.cancelled")
    assert (result.status_code, result.success, result.webhook_endpoint_id) == (200, True, created.id)
    event = unwrap(receiver.requests[-1], rotated.signing_secret)
    assert event.type == "batch.cancelled"

    deleted = sdk.webhooks.delete(created.id)
    assert (deleted.id, deleted.deleted, deleted.object) == (created.id, True, "webhook_endpoint.deleted")
    with pytest.raises(openai.NotFoundError):
        sdk.webhooks.retrieve(created.id)


def test_without_event_types_an_endpoint_gets_every_batch_event(api, loopback, receiver):
    response = api.post("/v1/webhook_endpoints", {"url": receiver.url}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["event_types"] == list(EVENT_TYPES)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://10.1.2.3/hook", "10.1.2.3, a private address"),
        ("https://192.168.1.10/hook", "192.168.1.10, a private address"),
        ("http://169.254.169.254/latest/meta-data", "169.254.169.254, a link-local address"),
        ("http://[fe80::1]/hook", "a link-local address"),
        ("http://[::ffff:10.0.0.1]/hook", "a private address"),
        ("http://224.0.0.1/hook", "a multicast address"),
        ("http://0.0.0.0:8080/", "an unspecified address"),
        ("http://100.64.0.1/", "a non-global address"),
        ("http://127.0.0.1:8080/hook", "127.0.0.1, a loopback address"),
        ("http://[::1]:8080/hook", "::1, a loopback address"),
        ("http://localhost:8080/hook", "a loopback address"),
        ("ftp://example.com/hook", "https:// or http://"),
        ("http://user:secret@93.184.216.34/", "credentials"),
        ("not a url", "spaces"),
        ("http://no-such-host.invalid/hook", "could not be resolved"),
    ],
)
def test_private_and_malformed_urls_are_refused(api, url, reason):
    response = api.post("/v1/webhook_endpoints", {"url": url}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == "url" and error["type"] == "invalid_request_error"
    assert reason in error["message"], error["message"]
    assert not WebhookEndpoint.objects.exists()


def test_loopback_is_allowed_only_by_the_setting_and_only_loopback(api, loopback):
    for url in ("http://127.0.0.1:9/hook", "http://[::1]:9/hook", "http://127.3.4.5/"):
        assert api.post("/v1/webhook_endpoints", {"url": url}, format="json").status_code == 200, url
    for url in ("http://10.0.0.1/", "http://169.254.1.1/", "http://192.168.0.1/"):
        assert api.post("/v1/webhook_endpoints", {"url": url}, format="json").status_code == 400, url


def test_address_refusal_names_the_range():
    assert address_refusal("8.8.8.8", allow_loopback=False) is None
    assert address_refusal("2606:4700:4700::1111", allow_loopback=False) is None
    assert address_refusal("172.16.0.1", allow_loopback=False) == "private"
    assert address_refusal("fc00::1", allow_loopback=False) == "private"
    assert address_refusal("::1", allow_loopback=True) is None
    assert address_refusal("::ffff:127.0.0.1", allow_loopback=False) == "loopback"
    assert address_refusal("240.0.0.1", allow_loopback=False) in ("reserved", "private")


def test_an_update_to_a_private_url_is_refused(api, loopback, receiver):
    endpoint_id = api.post("/v1/webhook_endpoints", {"url": receiver.url}, format="json").json()["id"]
    response = api.post(f"/v1/webhook_endpoints/{endpoint_id}", {"url": "http://10.0.0.1/"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "url"
    assert WebhookEndpoint.objects.get(id=endpoint_id).url == receiver.url


def test_bad_event_types_and_names_are_400(api, loopback, receiver):
    for body, param in (
        # The element at fault, as OpenAI writes a path (and as line errors do: messages[1].role).
        ({"url": receiver.url, "event_types": ["response.completed"]}, "event_types[0]"),
        ({"url": receiver.url, "event_types": []}, "event_types"),
        ({"url": receiver.url, "event_types": "batch.completed"}, "event_types"),
        ({"url": receiver.url, "name": 5}, "name"),
        ({"url": 5}, "url"),
        ({}, "url"),
    ):
        response = api.post("/v1/webhook_endpoints", body, format="json")
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.content)


def test_other_tenants_endpoints_are_not_found(api, other_tenant, loopback, receiver):
    theirs = services.webhook_endpoint_create(tenant=other_tenant, url=receiver.url)
    base = f"/v1/webhook_endpoints/{theirs.id}"
    assert api.get(base).status_code == 404
    assert api.post(base, {"name": "mine"}, format="json").status_code == 404
    assert api.delete(base).status_code == 404
    assert api.post(f"{base}/rotate_secret", {}, format="json").status_code == 404
    assert api.post(f"{base}/test", {"event_type": "batch.completed"}, format="json").status_code == 404
    assert api.get(f"{base}/deliveries").status_code == 404
    assert api.get("/v1/webhook_endpoints").json()["data"] == []
    assert WebhookEndpoint.objects.get(id=theirs.id).name == ""
    assert receiver.requests == []
    assert APIClient().get("/v1/webhook_endpoints").status_code == 401


def test_the_delivery_log_shows_each_delivery(api, tenant, loopback, receiver, messages):
    endpoint_id = api.post("/v1/webhook_endpoints", {"url": receiver.url}, format="json").json()["id"]
    [delivery_id] = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_9", event_type="batch.completed")
    page = api.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries").json()
    [entry] = page["data"]
    assert (entry["id"], entry["status"], entry["attempts"], entry["object"]) == (
        delivery_id,
        "pending",
        0,
        "webhook_delivery",
    )
    assert entry["event"]["type"] == "batch.completed" and entry["event"]["data"] == {"id": "batch_9"}

    from django.utils import timezone

    attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    [entry] = api.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries?status=succeeded").json()["data"]
    assert (entry["status"], entry["attempts"], entry["last_status_code"], entry["next_attempt_at"]) == (
        "succeeded",
        1,
        200,
        None,
    )
    assert api.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries?status=failed").json()["data"] == []
    assert api.get(f"/v1/webhook_endpoints/{endpoint_id}/deliveries?status=nope").status_code == 400


def test_a_test_call_to_an_unreachable_endpoint_is_a_400(api, loopback):
    from tests.support.webhook_receiver import Receiver

    gone = Receiver()
    url = gone.url
    gone.close()
    endpoint_id = api.post("/v1/webhook_endpoints", {"url": url}, format="json").json()["id"]
    response = api.post(f"/v1/webhook_endpoints/{endpoint_id}/test", {"event_type": "batch.completed"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "webhook_delivery_failed"
    response = api.post(f"/v1/webhook_endpoints/{endpoint_id}/test", {"event_type": "nope"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["param"] == "event_type"


def test_a_tenant_has_at_most_twenty_endpoints(api, loopback):
    for _ in range(services.MAX_ENDPOINTS_PER_TENANT):
        assert api.post("/v1/webhook_endpoints", {"url": "http://127.0.0.1:9/"}, format="json").status_code == 200
    response = api.post("/v1/webhook_endpoints", {"url": "http://127.0.0.1:9/"}, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "webhook_endpoint_limit"
