"""Webhook calls end at their deadline whatever the receiver does, and one tenant's slow receiver cannot hold
the threads others need: a trickling receiver (one byte every 2 s, so no per-read timeout ever fires) against
a delivery attempt, the /test call, ten concurrent /test calls beside another tenant's API calls, and the
per-endpoint cap of the webhooks worker."""

from __future__ import annotations

import http.client
import socket
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.webhooks import attempts, services
from controlplane.webhooks.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from tests.support.webhook_receiver import Receiver
from tests.webhooks.bounded_server import BoundedServer

TRICKLE_SECONDS = 2.0  # the receiver: one byte every two seconds


@pytest.fixture
def trickling():
    receiver = Receiver(trickle=TRICKLE_SECONDS)
    yield receiver
    receiver.close()


def _emit(tenant, batch_id="batch_abc") -> str:
    [delivery_id] = services.batch_event_emit(tenant_id=tenant.id, batch_id=batch_id, event_type="batch.completed")
    return delivery_id


@pytest.mark.django_db
def test_a_trickling_receiver_is_cut_at_the_attempts_deadline(tenant, loopback, messages, settings, trickling):
    # Each byte comes within the old per-read timeout (3 s > 2 s): only an overall deadline ends the call.
    settings.WEBHOOK_TIMEOUT_SECONDS = 3.0
    services.webhook_endpoint_create(tenant=tenant, url=trickling.url)
    delivery_id = _emit(tenant)
    started = time.monotonic()
    outcome = attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    elapsed = time.monotonic() - started
    assert outcome is not None and outcome.status_code is None and "timed out" in outcome.error
    assert 2.9 <= elapsed < 4.0, elapsed
    assert outcome.duration_ms < 4000
    delivery = WebhookDelivery.objects.get(id=delivery_id)
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1


@pytest.mark.django_db
def test_the_attempt_lease_outlives_the_deadline(settings):
    settings.WEBHOOK_TIMEOUT_SECONDS = 10.0
    assert attempts.attempt_lease() > timedelta(seconds=10)
    settings.WEBHOOK_TIMEOUT_SECONDS = 300.0  # an operator's long deadline moves the lease with it
    assert attempts.attempt_lease() > timedelta(seconds=300)


@pytest.mark.django_db
def test_a_test_call_is_cut_at_its_cap(api, loopback, settings, trickling):
    settings.WEBHOOK_TEST_TIMEOUT_SECONDS = 2.0
    endpoint_id = api.post("/v1/webhook_endpoints", {"url": trickling.url}, format="json").json()["id"]
    started = time.monotonic()
    response = api.post(f"/v1/webhook_endpoints/{endpoint_id}/test", {"event_type": "batch.completed"}, format="json")
    assert time.monotonic() - started < 3.0
    assert response.status_code == 400 and response.json()["error"]["code"] == "webhook_delivery_failed"
    assert "timed out" in response.json()["error"]["message"]


def _call(base: str, method: str, path: str, key: str, body: bytes | None = None) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection(base.removeprefix("http://"), timeout=60)
    try:
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        conn.request(method, path, body=body, headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    return status, time.monotonic() - started


@pytest.mark.django_db(transaction=True)
def test_ten_concurrent_tests_to_a_slow_receiver_leave_other_tenants_fast(
    tenant, other_tenant, loopback, settings, trickling
):
    settings.WEBHOOK_TEST_TIMEOUT_SECONDS = 2.0
    endpoint = services.webhook_endpoint_create(tenant=tenant, url=trickling.url)
    server = BoundedServer(threads=4)  # one gunicorn process of the local runner: --threads 4
    try:
        body = b'{"event_type": "batch.completed"}'
        path = f"/v1/webhook_endpoints/{endpoint.id}/test"
        with ThreadPoolExecutor(max_workers=10) as pool:
            tests = [pool.submit(_call, server.url, "POST", path, tenant.raw_key, body) for _ in range(10)]
            time.sleep(0.3)  # the tests are in
            others = []
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                others.append(_call(server.url, "GET", "/v1/batches", other_tenant.raw_key))
                time.sleep(0.05)
            results = [future.result() for future in tests]
    finally:
        server.close()
    assert {status for status, _ in others} == {200}
    latencies = [seconds for _, seconds in others]
    assert statistics.median(latencies) < 0.2 and max(latencies) < 1.0, latencies
    # One test per tenant runs in a process (400 at its 2 s cap); the others are 429 at once.
    statuses = sorted(status for status, _ in results)
    assert statuses.count(400) >= 1 and set(statuses) <= {400, 429}, statuses
    assert max(seconds for _, seconds in results) < 3.5


def _attempt_in_thread(delivery_id: str, now, results: dict[str, object]) -> threading.Thread:
    def run() -> None:
        try:
            results[delivery_id] = attempts.delivery_attempt(delivery_id=delivery_id, now=now)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_one_endpoint_holds_one_worker_thread_and_a_held_delivery_is_not_claimed_again(
    tenant, other_tenant, loopback, messages, settings, trickling, receiver
):
    settings.WEBHOOK_TIMEOUT_SECONDS = 3.0
    services.webhook_endpoint_create(tenant=tenant, url=trickling.url)
    services.webhook_endpoint_create(tenant=other_tenant, url=receiver.url)
    slow_first, slow_second = _emit(tenant, "batch_1"), _emit(tenant, "batch_2")
    [other] = services.batch_event_emit(tenant_id=other_tenant.id, batch_id="batch_3", event_type="batch.completed")
    now = timezone.now()
    results: dict[str, object] = {}
    holder = _attempt_in_thread(slow_first, now, results)
    trickling.wait_for(1)  # its attempt is in flight
    # The same endpoint's next delivery waits in the database instead of taking a second thread ...
    started = time.monotonic()
    assert attempts.delivery_attempt(delivery_id=slow_second, now=now) is None
    assert time.monotonic() - started < 1.0
    deferred = WebhookDelivery.objects.get(id=slow_second)
    assert deferred.attempts == 0 and deferred.enqueued_at is None
    assert deferred.next_attempt_at >= now + timedelta(seconds=3)
    # ... another tenant's delivery goes on meanwhile ...
    outcome = attempts.delivery_attempt(delivery_id=other, now=now)
    assert outcome is not None and outcome.ok
    # ... and the delivery in flight is not due again, even at its deadline: no second attempt runs beside it.
    assert attempts.delivery_attempt(delivery_id=slow_first, now=now + timedelta(seconds=4)) is None
    holder.join(timeout=10)
    assert not holder.is_alive()
    assert len(trickling.requests) == 1
    held = WebhookDelivery.objects.get(id=slow_first)
    assert held.attempts == 1 and held.status == DeliveryStatus.FAILED
    # The cap was released with the attempt: the deferred delivery runs once it is due.
    assert attempts.delivery_attempt(delivery_id=slow_second, now=deferred.next_attempt_at) is not None


@pytest.fixture
def two_workers(settings):
    """The in-flight caps are per process (webhooks/inflight.py); a second webhooks worker has caps of its own,
    so nothing but the attempt lease and its fence stands between two workers' attempts of one delivery."""
    settings.WEBHOOK_MAX_INFLIGHT_PER_ENDPOINT = 2
    settings.WEBHOOK_MAX_INFLIGHT_PER_TENANT = 2


@pytest.mark.django_db(transaction=True)
def test_a_delivery_in_flight_is_not_due_for_another_worker_until_its_lease_ends(
    tenant, loopback, messages, settings, trickling, two_workers
):
    settings.WEBHOOK_TIMEOUT_SECONDS = 3.0
    services.webhook_endpoint_create(tenant=tenant, url=trickling.url)
    delivery_id = _emit(tenant)
    now = timezone.now()
    results: dict[str, object] = {}
    holder = _attempt_in_thread(delivery_id, now, results)
    trickling.wait_for(1)  # attempt 1 is in flight
    # Another worker (the sweep's message, a duplicate): at the attempt's deadline and to the end of its lease,
    # the delivery is not due, so no second POST runs beside the first.
    for later in (now + timedelta(seconds=3), now + attempts.attempt_lease() - timedelta(seconds=1)):
        assert attempts.delivery_attempt(delivery_id=delivery_id, now=later) is None
    holder.join(timeout=30)
    assert not holder.is_alive()
    assert len(trickling.requests) == 1
    row = WebhookDelivery.objects.get(id=delivery_id)
    assert (row.attempts, row.status) == (1, DeliveryStatus.FAILED)


@pytest.mark.django_db(transaction=True)
def test_an_attempt_taken_over_after_its_lease_cannot_overwrite_the_newer_outcome(
    tenant, loopback, messages, settings, trickling, receiver, two_workers
):
    """A worker presumed dead (its lease ran out) finishes after all: the attempt that took over has the last
    word. Fails when the ``attempts=number`` fence of the outcome record is removed."""
    settings.WEBHOOK_TIMEOUT_SECONDS = 5.0  # attempt 1 ends (timed out) long after attempt 2 succeeded
    endpoint = services.webhook_endpoint_create(tenant=tenant, url=trickling.url)
    delivery_id = _emit(tenant)
    now = timezone.now()
    results: dict[str, object] = {}
    holder = _attempt_in_thread(delivery_id, now, results)
    trickling.wait_for(1)
    WebhookEndpoint.objects.filter(id=endpoint.id).update(url=receiver.url)  # attempt 2 reaches a quick receiver
    taken_over = attempts.delivery_attempt(delivery_id=delivery_id, now=now + attempts.attempt_lease())
    assert taken_over is not None and taken_over.ok
    holder.join(timeout=30)
    assert not holder.is_alive()
    stale = results[delivery_id]
    assert stale is not None and "timed out" in stale.error  # attempt 1 did end, and failed
    row = WebhookDelivery.objects.get(id=delivery_id)
    assert (row.status, row.attempts, row.last_status_code, row.next_attempt_at) == (
        DeliveryStatus.SUCCEEDED,
        2,
        200,
        None,
    )
    assert sorted(WebhookAttempt.objects.filter(delivery_id=delivery_id).values_list("number", flat=True)) == [1, 2]


def test_checking_an_endpoints_url_is_capped_like_a_test_call(tenant, other_tenant, loopback, settings, monkeypatch):
    """Creating or updating an endpoint resolves its host on the web thread: a tenant's slow name server holds at
    most one thread per process for at most the deadline; its next create is a 429 at once, others go on."""
    from controlplane.core.http.errors import QuotaExceeded
    from controlplane.webhooks.urlguard import UnsafeUrl

    settings.WEBHOOK_TEST_TIMEOUT_SECONDS = 1.0
    real = socket.getaddrinfo

    def resolver(host, *args, **kwargs):
        if host == "slow.example":
            time.sleep(3)  # a name server that answers late
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    outcome: dict[str, object] = {}

    def slow_create() -> None:
        started = time.monotonic()
        try:
            services.webhook_endpoint_create(tenant=tenant, url="https://slow.example/hook")
        except UnsafeUrl as error:
            outcome["error"] = error
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=slow_create)
    thread.start()
    time.sleep(0.3)  # its lookup is in flight
    started = time.monotonic()
    with pytest.raises(QuotaExceeded):
        services.webhook_endpoint_create(tenant=tenant, url="http://127.0.0.1:9/hook")
    assert time.monotonic() - started < 0.5
    endpoint = services.webhook_endpoint_create(tenant=other_tenant, url="http://127.0.0.1:9/hook")
    assert endpoint.tenant_id == other_tenant.id
    thread.join(timeout=10)
    assert "could not be resolved" in str(outcome["error"]) and outcome["seconds"] < 2.0
    # The cap is released: the tenant can create again.
    assert services.webhook_endpoint_create(tenant=tenant, url="http://127.0.0.1:9/hook").tenant_id == tenant.id
