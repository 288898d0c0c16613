"""The transactional outbox of controlplane/core/messaging/dispatch.py, against a real Redis broker that the test
starts and stops (a throwaway redis-server on a spare port), so "broker down" is a refused connection
as in production, not a raised exception of our own."""

from __future__ import annotations

import base64
import json
import runpy
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from celery import Celery
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from controlplane.batches.models import Batch, BatchStatus
from controlplane.core.messaging import dispatch
from controlplane.core.models import OutboxMessage
from tests.chaos.services import ThrowawayRedis
from tests.support.batches import embedding_line, jsonl
from tests.support.row_locks import beside_held_rows

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs the redis-server binary")


@pytest.fixture
def broker(monkeypatch) -> Iterator[ThrowawayRedis]:
    server = ThrowawayRedis()
    # Celery lets CELERY_BROKER_URL (set by `make test`) override the constructor's broker: drop it here.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    app = Celery("outbox-test", broker=server.url())
    monkeypatch.setattr(dispatch, "current_app", app)
    yield server
    server.destroy()


def _create_batch(api) -> object:
    upload = api.post(
        "/v1/files",
        {"file": SimpleUploadedFile("in.jsonl", jsonl([embedding_line("a", "x")])), "purpose": "batch"},
        format="multipart",
    )
    assert upload.status_code == 200, upload.content
    return api.post(
        "/v1/batches",
        {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"},
        format="json",
    )


@pytest.mark.django_db(transaction=True)
def test_with_the_broker_up_the_message_goes_out_and_the_row_is_gone(api, broker):
    broker.start()
    response = _create_batch(api)
    assert response.status_code == 200, response.content
    assert broker.queued("validation") == [(dispatch.VALIDATE, [response.json()["id"]])]
    assert not OutboxMessage.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_batch_created_while_the_broker_is_down_is_dispatched_once_it_is_back(api, broker):
    response = _create_batch(api)  # nothing listens on the broker's port
    assert response.status_code == 200, response.content  # committed, so not a 500
    batch_id = response.json()["id"]
    assert Batch.objects.get(id=batch_id).status == BatchStatus.VALIDATING
    assert list(OutboxMessage.objects.values_list("task_name", "args")) == [(dispatch.VALIDATE, [batch_id])]

    later = timezone.now() + timedelta(seconds=5)
    assert dispatch.outbox_relay(now=later) == 0  # still down: kept, with the broker's answer
    kept = OutboxMessage.objects.get()
    assert kept.attempts == 1 and kept.last_error

    broker.start()
    assert dispatch.outbox_relay(now=later) == 1
    assert broker.queued("validation") == [(dispatch.VALIDATE, [batch_id])]
    assert not OutboxMessage.objects.exists()
    assert dispatch.outbox_relay(now=later) == 0  # sent once, not again


@pytest.mark.django_db(transaction=True)
def test_the_relay_leaves_young_rows_to_their_own_send(broker):
    broker.start()
    OutboxMessage.objects.create(task_name=dispatch.FINALIZE, args=["batch_x"])
    assert dispatch.outbox_relay() == 0
    assert dispatch.outbox_relay(now=timezone.now() + dispatch.RELAY_GRACE * 2) == 1
    assert broker.queued() == [(dispatch.FINALIZE, ["batch_x"])]


@pytest.mark.django_db(transaction=True)
def test_regenerable_messages_are_dropped_not_raised_when_the_broker_is_down(broker):
    # Slot top-ups are re-derived by beat; a failed send must not fail the transaction's caller.
    dispatch.slots_topup_enqueue("identity")
    assert not OutboxMessage.objects.exists()


@pytest.mark.row_locks
@pytest.mark.django_db(transaction=True)
def test_the_relay_skips_a_row_another_relay_is_sending(broker):
    """Two beat relays (an overlap after a slow run, two beat processes in a failover) never wait on each other
    nor send one row twice: the relay skips the rows another transaction holds (SKIP LOCKED) and sends the rest."""
    broker.start()
    held, free = (OutboxMessage.objects.create(task_name=dispatch.FINALIZE, args=[f"batch_{n}"]) for n in "ab")
    later = timezone.now() + dispatch.RELAY_GRACE * 2
    sent, took = beside_held_rows("core_outboxmessage", [held.id], lambda: dispatch.outbox_relay(now=later))
    assert sent == 1
    assert broker.queued() == [(dispatch.FINALIZE, ["batch_b"])]
    assert list(OutboxMessage.objects.values_list("id", flat=True)) == [held.id]  # left to the relay holding it
    assert not OutboxMessage.objects.filter(id=free.id).exists()
    print(f"relay beside a held row: {took * 1000:.0f} ms")


def _clients(server: ThrowawayRedis) -> int:
    return len(redis.Redis.from_url(server.url()).client_list()) - 1  # less this query's own connection


def test_a_web_process_connects_to_the_broker_before_its_first_request(broker):
    """gunicorn's post_worker_init warms the broker connection (gunicorn.conf.py): the first create of a process
    used to pay ~0.3 s for it, and its validation started that much later."""
    broker.start()
    assert _clients(broker) == 0
    dispatch.broker_warm()
    assert _clients(broker) == 1


def test_broker_warm_with_the_broker_down_only_logs(broker, monkeypatch):
    warned = []
    monkeypatch.setattr(dispatch.logger, "warning", lambda message, *args: warned.append(message % args))
    dispatch.broker_warm()  # no exception: the web process serves, its first send connects (or the outbox holds it)
    assert len(warned) == 1 and "broker not reached at start-up" in warned[0]


def test_gunicorn_warms_each_web_process(monkeypatch):
    calls = []
    monkeypatch.setattr(dispatch, "broker_warm", lambda: calls.append("warm"))
    hooks = runpy.run_path(str(Path(__file__).resolve().parents[2] / "gunicorn.conf.py"))
    hooks["post_worker_init"](object())
    assert calls == ["warm"]
