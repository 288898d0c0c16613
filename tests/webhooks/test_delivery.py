"""Delivering to a real HTTP receiver: Standard Webhooks signatures that the openai SDK verifies, the same
webhook-id on every attempt, exponential backoff scheduled in the database, exhaustion after the window,
redelivery, the sweep, and the address check repeated at every attempt."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

import openai
import pytest
from django.utils import timezone

from controlplane.core.messaging import dispatch
from controlplane.webhooks import attempts, services
from controlplane.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEvent
from tests.support.webhook_receiver import Receiver
from tests.webhooks.conftest import unwrap

pytestmark = pytest.mark.django_db


def _endpoint(tenant, url, **kw):
    return services.webhook_endpoint_create(tenant=tenant, url=url, **kw)


def _emit(tenant, event_type="batch.completed", batch_id="batch_abc") -> WebhookDelivery:
    [delivery_id] = services.batch_event_emit(tenant_id=tenant.id, batch_id=batch_id, event_type=event_type)
    return WebhookDelivery.objects.get(id=delivery_id)


def _reload(delivery: WebhookDelivery) -> WebhookDelivery:
    return WebhookDelivery.objects.get(id=delivery.id)


def test_a_delivery_is_signed_and_the_sdk_unwraps_it(tenant, loopback, receiver, messages):
    endpoint = _endpoint(tenant, receiver.url)
    assert endpoint.secret.startswith("whsec_")
    delivery = _emit(tenant, "batch.completed", "batch_123")
    outcome = attempts.delivery_attempt(delivery_id=delivery.id, now=timezone.now())
    assert outcome is not None and outcome.ok

    [request] = receiver.requests
    assert request.path == "/hooks/openai?source=test"
    assert request.headers["webhook-id"] == delivery.id
    assert request.headers["content-type"] == "application/json"
    event = unwrap(request, endpoint.secret)
    assert isinstance(event, openai.types.webhooks.BatchCompletedWebhookEvent)
    assert (event.type, event.data.id, event.object) == ("batch.completed", "batch_123", "event")
    assert event.id == delivery.event_id and event.id.startswith("evt_")
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(request, services.secret_new())  # another endpoint's secret does not verify it

    delivery = _reload(delivery)
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (DeliveryStatus.SUCCEEDED, 1, 200)
    assert delivery.next_attempt_at is None
    [logged] = WebhookAttempt.objects.filter(delivery=delivery)
    assert (logged.number, logged.status_code, logged.response_excerpt) == (1, 200, "ok")


def test_failures_are_retried_with_backoff_and_the_same_webhook_id(tenant, loopback, messages):
    receiver = Receiver(fail_first=2, fail_status=503)
    try:
        endpoint = _endpoint(tenant, receiver.url)
        delivery = _emit(tenant, "batch.failed")
        t0 = timezone.now()
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=t0).status_code == 503
        delivery = _reload(delivery)
        assert delivery.status == DeliveryStatus.FAILED and delivery.last_error.startswith("HTTP 503")
        first_retry = delivery.next_attempt_at
        assert t0 + timedelta(seconds=5) <= first_retry < t0 + timedelta(seconds=6)  # the first backoff: 5 s
        # Not due yet: nothing is sent, whoever asks (a duplicate message, an early sweep).
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=first_retry - timedelta(seconds=1)) is None

        assert attempts.delivery_attempt(delivery_id=delivery.id, now=first_retry).status_code == 503
        second_retry = _reload(delivery).next_attempt_at
        assert first_retry + timedelta(seconds=10) <= second_retry < first_retry + timedelta(seconds=11)
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=second_retry).ok
        # The message that triggered an attempt is used up: a second one finds nothing to do.
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=second_retry) is None

        requests = receiver.requests
        assert len(requests) == 3
        assert {r.headers["webhook-id"] for r in requests} == {delivery.id}
        assert {unwrap(r, endpoint.secret).id for r in requests} == {delivery.event_id}
        assert {r.body for r in requests} == {requests[0].body}  # the same bytes on every attempt
        log = list(
            WebhookAttempt.objects.filter(delivery=delivery).order_by("number").values_list("number", "status_code")
        )
        assert log == [(1, 503), (2, 503), (3, 200)]
        assert _reload(delivery).status == DeliveryStatus.SUCCEEDED
    finally:
        receiver.close()


def test_a_delivery_is_exhausted_after_the_retry_window(tenant, loopback, messages, settings):
    receiver = Receiver(fail_first=10_000)
    try:
        _endpoint(tenant, receiver.url)
        delivery = _emit(tenant, "batch.expired")
        now = timezone.now()
        while (current := _reload(delivery)).status in (DeliveryStatus.PENDING, DeliveryStatus.FAILED):
            now = current.next_attempt_at
            assert attempts.delivery_attempt(delivery_id=delivery.id, now=now) is not None
        assert current.status == DeliveryStatus.EXHAUSTED and current.next_attempt_at is None
        starts = list(
            WebhookAttempt.objects.filter(delivery=delivery).order_by("number").values_list("started_at", flat=True)
        )
        gaps = [(b - a).total_seconds() for a, b in pairwise(starts)]
        expected = [min(5 * 2**n, 3600) for n in range(len(gaps))]
        assert all(want <= gap < want + 1 for gap, want in zip(gaps, expected, strict=True)), gaps
        # Every attempt inside the 24 h window, and no room for another one in it.
        assert starts[-1] <= current.retry_until == current.created_at + timedelta(hours=24)
        assert starts[-1] + timedelta(seconds=3600) > current.retry_until
        assert len(receiver.requests) == len(starts) == 33
        assert {r.headers["webhook-id"] for r in receiver.requests} == {delivery.id}
    finally:
        receiver.close()


def test_redeliver_sends_again_with_the_same_webhook_id(
    tenant, loopback, receiver, messages, django_capture_on_commit_callbacks
):
    endpoint = _endpoint(tenant, receiver.url)
    delivery = _emit(tenant)
    attempts.delivery_attempt(delivery_id=delivery.id, now=timezone.now())
    messages.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert services.deliveries_redeliver(delivery_ids=[delivery.id, "wh_unknown"]) == 1
    assert messages == [(dispatch.WEBHOOK_DELIVER, [delivery.id])]
    assert _reload(delivery).status == DeliveryStatus.PENDING
    assert attempts.delivery_attempt(delivery_id=delivery.id, now=timezone.now()).ok
    first, second = receiver.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.id
    assert unwrap(second, endpoint.secret).id == unwrap(first, endpoint.secret).id
    assert _reload(delivery).attempts == 2


def test_emission_writes_rows_and_sends_on_commit_only_for_subscribed_enabled_endpoints(
    tenant, other_tenant, loopback, receiver, messages, django_capture_on_commit_callbacks
):
    everything = _endpoint(tenant, receiver.url)
    failed_only = _endpoint(tenant, receiver.url, event_types=["batch.failed"])
    paused = _endpoint(tenant, receiver.url)
    services.webhook_endpoint_enable(endpoint=paused, enabled=False)
    _endpoint(other_tenant, receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        ids = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_1", event_type="batch.completed")
        assert messages == []  # nothing leaves before the commit
    assert messages == [(dispatch.WEBHOOK_DELIVER, [ids[0]])]
    assert WebhookDelivery.objects.get(id=ids[0]).endpoint_id == everything.id
    assert receiver.requests == []  # emission never calls a receiver
    with django_capture_on_commit_callbacks(execute=True):
        ids = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_2", event_type="batch.failed")
    assert {WebhookDelivery.objects.get(id=i).endpoint_id for i in ids} == {everything.id, failed_only.id}
    # One event per batch state, shared by the endpoints; a tenant without endpoints gets no rows at all.
    assert WebhookEvent.objects.filter(object_id="batch_2").count() == 1
    assert services.batch_event_emit(tenant_id=other_tenant.id + 1000, batch_id="b", event_type="batch.failed") == []


def test_the_sweep_sends_due_deliveries_without_piling_up_messages(
    tenant, loopback, messages, django_capture_on_commit_callbacks
):
    receiver = Receiver(fail_first=1)
    try:
        endpoint = _endpoint(tenant, receiver.url)
        delivery = _emit(tenant)
        t0 = _reload(delivery).created_at

        def sweep(at):
            messages.clear()
            with django_capture_on_commit_callbacks(execute=True):
                attempts.deliveries_due_enqueue(now=at)
            return [args[0] for _, args in messages]

        # Its first message is recent: not sent again, unless it was lost (no attempt after 30 s).
        assert sweep(t0 + timedelta(seconds=10)) == []
        assert sweep(t0 + timedelta(seconds=31)) == [delivery.id]
        assert sweep(t0 + timedelta(seconds=32)) == []
        attempts.delivery_attempt(delivery_id=delivery.id, now=t0 + timedelta(seconds=40))  # fails: retry in 5 s
        assert sweep(t0 + timedelta(seconds=42)) == []
        assert sweep(t0 + timedelta(seconds=46)) == [delivery.id]
        services.webhook_endpoint_enable(endpoint=endpoint, enabled=False)
        assert sweep(t0 + timedelta(seconds=100)) == []  # a paused endpoint's deliveries wait
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=t0 + timedelta(seconds=100)) is None
        services.webhook_endpoint_enable(endpoint=endpoint, enabled=True)
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=t0 + timedelta(seconds=100)).ok
        assert sweep(t0 + timedelta(seconds=200)) == []
    finally:
        receiver.close()


def test_the_address_is_checked_again_at_every_attempt(tenant, loopback, receiver, messages, settings):
    _endpoint(tenant, receiver.url)  # registered while loopback was allowed
    delivery = _emit(tenant)
    settings.WEBHOOK_ALLOW_LOOPBACK = False  # now the host resolves to a refused address (DNS rebinding)
    outcome = attempts.delivery_attempt(delivery_id=delivery.id, now=timezone.now())
    assert outcome is not None and outcome.status_code is None
    assert "127.0.0.1, a loopback address" in outcome.error
    assert receiver.requests == []  # never connected
    assert _reload(delivery).status == DeliveryStatus.FAILED


def test_unreachable_and_slow_receivers_are_failed_attempts(tenant, loopback, messages, settings):
    closed = Receiver()
    url = closed.url
    closed.close()  # nothing listens there any more
    _endpoint(tenant, url)
    delivery = _emit(tenant)
    outcome = attempts.delivery_attempt(delivery_id=delivery.id, now=timezone.now())
    assert outcome.status_code is None and "ConnectionRefusedError" in outcome.error

    settings.WEBHOOK_TIMEOUT_SECONDS = 0.5
    slow = Receiver(delay=3)
    try:
        services.webhook_endpoint_update(endpoint=delivery.endpoint, url=slow.url)
        outcome = attempts.delivery_attempt(delivery_id=delivery.id, now=_reload(delivery).next_attempt_at)
        assert outcome.status_code is None and "timed out" in outcome.error and outcome.duration_ms < 2500
        assert _reload(delivery).status == DeliveryStatus.FAILED
    finally:
        slow.close()


def test_a_rotated_secret_with_overlap_signs_with_both(tenant, loopback, receiver, messages):
    endpoint = _endpoint(tenant, receiver.url)
    old = endpoint.secret
    endpoint = services.webhook_endpoint_rotate_secret(endpoint=endpoint, keep_old_secret_active_for_24_hours=True)
    attempts.delivery_attempt(delivery_id=_emit(tenant).id, now=timezone.now())
    [request] = receiver.requests
    assert len(request.headers["webhook-signature"].split()) == 2
    assert unwrap(request, old).type == unwrap(request, endpoint.secret).type == "batch.completed"

    services.webhook_endpoint_rotate_secret(endpoint=endpoint)
    endpoint.refresh_from_db()
    attempts.delivery_attempt(delivery_id=_emit(tenant, batch_id="batch_2").id, now=timezone.now())
    latest = receiver.requests[-1]
    assert unwrap(latest, endpoint.secret).data.id == "batch_2"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        unwrap(latest, old)


def test_https_checks_the_certificate_for_the_host_while_connecting_to_the_checked_address(
    tenant, loopback, messages, monkeypatch, tmp_path
):
    from tests.webhooks.tls import server_context

    context, ca_path = server_context(tmp_path, dns_names=["localhost"])
    monkeypatch.setenv("SSL_CERT_FILE", str(ca_path))  # trust the test CA (ssl.create_default_context reads it)
    receiver = Receiver(tls=context)
    try:
        port = receiver.server.server_address[1]
        good = _endpoint(tenant, f"https://localhost:{port}/hook", event_types=["batch.completed"])
        bad = _endpoint(tenant, f"https://127.0.0.1:{port}/hook", event_types=["batch.failed"])
        delivery = _emit(tenant, "batch.completed")
        assert attempts.delivery_attempt(delivery_id=delivery.id, now=timezone.now()).ok
        [request] = receiver.requests
        assert request.headers["host"] == f"localhost:{port}"
        assert unwrap(request, good.secret).data.id == "batch_abc"
        # The certificate names localhost only: a URL naming the address itself fails verification.
        outcome = attempts.delivery_attempt(delivery_id=_emit(tenant, "batch.failed").id, now=timezone.now())
        assert outcome.status_code is None and "CERTIFICATE_VERIFY_FAILED" in outcome.error
        assert len(receiver.requests) == 1 and bad.id
    finally:
        receiver.close()
