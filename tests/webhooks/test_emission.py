"""Every terminal batch state emits its webhook event, in the transaction that sets the status: batches
driven through the services with the fake backend (as tests/batches/test_lifecycle.py does)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from controlplane.webhooks import attempts
from controlplane.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEvent
from controlplane.webhooks.services import webhook_endpoint_create
from controlplane.webhooks.tasks import deliver_task
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch
from tests.support.webhook_receiver import Receiver
from tests.webhooks.conftest import unwrap

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def eager(settings, messages):
    settings.SHARD_MAX_LINES = 4
    return messages


@pytest.fixture
def endpoint(tenant, loopback, receiver):
    return webhook_endpoint_create(tenant=tenant, url=receiver.url)


def _create(tenant, lines) -> Batch:
    file = upload(tenant, jsonl(lines))
    return services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )


def _run_all(batch: Batch) -> None:
    run_batch(batch, FakeBackend())


def _events(batch: Batch) -> list[str]:
    return list(WebhookEvent.objects.filter(object_id=batch.id).values_list("type", flat=True))


def _deliver_messages(messages) -> list[str]:
    return [args[0] for task, args in messages if task == dispatch.WEBHOOK_DELIVER]


def _lines(n: int) -> list[dict]:
    return [embedding_line(f"r{i}", f"text {i}") for i in range(n)]


def test_completed(tenant, endpoint, eager):
    batch = _create(tenant, _lines(6))
    services.batch_validate(batch_id=batch.id)
    assert _events(batch) == []  # in_progress is no terminal state
    _run_all(batch)
    assert Batch.objects.get(id=batch.id).status == BatchStatus.COMPLETED
    assert _events(batch) == ["batch.completed"]
    [delivery] = WebhookDelivery.objects.filter(event__object_id=batch.id)
    assert (delivery.endpoint_id, delivery.status) == (endpoint.id, DeliveryStatus.PENDING)
    assert _deliver_messages(eager) == [delivery.id]
    # The event's time is the batch's completed_at.
    assert delivery.event.created_at == Batch.objects.get(id=batch.id).completed_at


def test_failed_validation(tenant, endpoint, eager):
    batch = _create(tenant, [b"{not json"])
    services.batch_validate(batch_id=batch.id)
    assert Batch.objects.get(id=batch.id).status == BatchStatus.FAILED
    assert _events(batch) == ["batch.failed"]


def test_cancelled_while_validating(tenant, endpoint, eager):
    batch = _create(tenant, _lines(2))
    services.batch_cancel(batch=batch)
    assert _events(batch) == ["batch.cancelled"]
    services.batch_cancel(batch=batch)  # idempotent: no second event
    assert _events(batch) == ["batch.cancelled"]


def test_cancelled_in_progress(tenant, endpoint, eager):
    batch = _create(tenant, _lines(8))
    services.batch_validate(batch_id=batch.id)
    services.batch_cancel(batch=Batch.objects.get(id=batch.id))
    assert _events(batch) == []  # cancelling is not terminal yet
    batch_try_finalize(batch_id=batch.id)
    assert Batch.objects.get(id=batch.id).status == BatchStatus.CANCELLED
    assert _events(batch) == ["batch.cancelled"]


def test_expired_while_validating(tenant, endpoint, eager):
    """It keeps validating (its lines are answered by custom_id), so batch.expired is sent when it finalizes."""
    batch = _create(tenant, _lines(2))
    Batch.objects.filter(id=batch.id).update(expires_at=timezone.now())
    assert services.batches_expire() == [batch.id]
    assert _events(batch) == []
    services.batch_validate(batch_id=batch.id)
    batch_try_finalize(batch_id=batch.id)
    assert Batch.objects.get(id=batch.id).status == BatchStatus.EXPIRED
    assert _events(batch) == ["batch.expired"]


def test_expired_in_progress(tenant, endpoint, eager):
    batch = _create(tenant, _lines(8))
    services.batch_validate(batch_id=batch.id)
    Batch.objects.filter(id=batch.id).update(expires_at=timezone.now())
    services.batches_expire()
    assert _events(batch) == []
    batch_try_finalize(batch_id=batch.id)
    assert _events(batch) == ["batch.expired"]
    assert batch_try_finalize(batch_id=batch.id) is False  # a second finalizer emits nothing
    assert _events(batch) == ["batch.expired"]


def test_a_slow_receiver_does_not_delay_the_batch(tenant, loopback, settings, monkeypatch):
    """The deliver message goes to a worker thread, as to the webhooks queue's worker: the next batch completes
    while the receiver still holds the first batch's delivery unanswered."""
    settings.SHARD_MAX_LINES = 4
    release = threading.Event()
    slow = Receiver(hold=release)
    workers: list[threading.Thread] = []

    def worker(delivery_id: str) -> None:
        try:
            deliver_task(delivery_id)
        finally:
            connection.close()

    def send(task_name: str, args: list) -> None:
        if task_name == dispatch.WEBHOOK_DELIVER:
            workers.append(threading.Thread(target=worker, args=args))
            workers[-1].start()

    monkeypatch.setattr(dispatch, "send", send)
    try:
        endpoint = webhook_endpoint_create(tenant=tenant, url=slow.url)
        first = _create(tenant, _lines(4))
        services.batch_validate(batch_id=first.id)
        _run_all(first)
        assert Batch.objects.get(id=first.id).status == BatchStatus.COMPLETED
        slow.wait_for(1, timeout=5)  # the worker is now waiting on the receiver...
        # ...and the next batch runs to completion meanwhile.
        second = _create(tenant, _lines(4))
        services.batch_validate(batch_id=second.id)
        _run_all(second)
        assert Batch.objects.get(id=second.id).status == BatchStatus.COMPLETED
        assert slow.answered == 0, "the first delivery is still waiting on the receiver"
        release.set()
        for thread in workers:
            thread.join(timeout=30)
        # The second delivery came while the endpoint's first was in flight: it waited in the database (one
        # attempt per endpoint at a time, inflight.py) and goes when due.
        for waiting in WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING):
            attempts.delivery_attempt(delivery_id=waiting.id, now=waiting.next_attempt_at)
        received = slow.wait_for(2)
        assert {unwrap(r, endpoint.secret).data.id for r in received} == {first.id, second.id}
        assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.SUCCEEDED}
    finally:
        release.set()
        slow.close()
