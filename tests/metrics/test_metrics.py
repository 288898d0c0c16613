"""Prometheus metrics: a batch run through the services with the fake backend, then /metrics scraped with the
token and parsed as Prometheus would; the database gauges; the Triton call metrics; the endpoint's guard."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import numpy as np
import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.core.http.errors import QuotaExceeded, api_exception_handler
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel, Placement, PlacementStatus, TritonServer
from controlplane.triton.client import TransientTritonError, TritonClient
from controlplane.webhooks import attempts
from controlplane.webhooks import services as webhook_services
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_batch
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "scrape-token-for-tests"
MODEL = "all-MiniLM-L6-v2"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def eager(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_DB_GAUGES = True


def scrape() -> Samples:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _batch(tenant, lines) -> Batch:
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def test_a_batch_shows_in_the_scrape_by_model_without_tenant_or_batch_ids(tenant, eager):
    lines = [embedding_line(f"req-{i}", f"sentence {i}") for i in range(10)]
    lines[7] = embedding_line("req-7", "REJECT this one")  # a permanent error: one failed line
    batch = _batch(tenant, lines)
    assert batch.status == BatchStatus.IN_PROGRESS
    before = scrape()
    # Validated, not yet run: three runnable shards of ten lines, waiting since the batch started.
    assert value(before, "batch_shards_runnable", model=MODEL, priority="normal") == 3
    assert value(before, "batch_lines_runnable", model=MODEL, priority="normal") == 10
    assert value(before, "batch_oldest_runnable_age_seconds", model=MODEL) >= 0
    assert 23 * 3600 < value(before, "batch_runnable_deadline_seconds", model=MODEL) <= 24 * 3600

    backend = FakeBackend()
    assert run_batch(batch, backend) == ["succeeded"] * 3
    batch.refresh_from_db()
    assert (batch.completed_lines, batch.failed_lines) == (9, 1)
    after = scrape()

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("batch_lines_completed_total", model=MODEL) == 9
    assert delta("batch_lines_failed_total", model=MODEL) == 1
    assert delta("shard_duration_seconds_count", model=MODEL) == 3  # one observation per shard
    assert delta("shard_duration_seconds_sum", model=MODEL) > 0
    assert delta("shard_duration_seconds_bucket", model=MODEL, le="+Inf") == 3
    assert value(after, "batch_shards_runnable", model=MODEL, priority="normal") == 0
    assert value(after, "batch_lines_running", model=MODEL, priority="normal") == 0

    # (The tenant's integer pk is not searched for: python_gc_* carry generation="1".)
    ids = {tenant.name, batch.id, batch.input_file_id, str(batch.output_file_id), str(batch.error_file_id)}
    for name, labels in after:
        for label, label_value in labels:
            assert label_value not in ids, (name, label)
            assert not label_value.startswith(("batch_", "file-")), (name, label)
            assert label not in {"tenant", "tenant_id", "batch", "batch_id"}, name


def test_dead_shards_breakers_and_placements_come_from_the_database(tenant, eager):
    batch = _batch(tenant, [embedding_line(f"req-{i}", f"s {i}") for i in range(8)])
    first = Shard.objects.filter(batch=batch).order_by("index").first()
    assert first is not None
    Shard.objects.filter(id=first.id).update(status=ShardStatus.DEAD)
    now = timezone.now()
    down = TritonServer.objects.create(
        name="gpu-a", grpc_url="10.0.0.1:8001", breaker_open_until=now + timedelta(seconds=30)
    )
    up = TritonServer.objects.create(
        name="gpu-b", grpc_url="10.0.0.2:8001", breaker_open_until=now - timedelta(seconds=1)
    )
    model = CatalogueModel.objects.get(name=MODEL)
    Placement.objects.create(model=model, server=down, instances=2, status=PlacementStatus.READY)
    Placement.objects.create(model=model, server=up, instances=1, status=PlacementStatus.LOADING)

    samples = scrape()
    assert value(samples, "batch_shards_dead", model=MODEL) == 1
    assert value(samples, "batch_shards_runnable", model=MODEL, priority="normal") == 1
    assert value(samples, "triton_server_breaker_open", server="gpu-a") == 1
    assert value(samples, "triton_server_breaker_open", server="gpu-b") == 0
    assert value(samples, "fleet_placements", model=MODEL, server="gpu-a", status="ready") == 1
    assert value(samples, "fleet_instances", model=MODEL, server="gpu-a", status="ready") == 2
    assert value(samples, "fleet_instances", model=MODEL, server="gpu-b", status="loading") == 1

    # Running shards count as running, not runnable.
    Shard.objects.filter(batch=batch, status=ShardStatus.PENDING).update(status=ShardStatus.RUNNING)
    samples = scrape()
    assert value(samples, "batch_shards_running", model=MODEL, priority="normal") == 1
    assert value(samples, "batch_lines_running", model=MODEL, priority="normal") == 4
    assert ("batch_oldest_runnable_age_seconds", (("model", MODEL),)) not in samples


def test_db_gauges_only_where_enabled(tenant, eager, settings):
    _batch(tenant, [embedding_line("req-0", "s")])
    settings.METRICS_DB_GAUGES = False
    samples = scrape()
    assert not any(name.startswith(("batch_shards_", "fleet_")) for name, _ in samples)


def test_triton_calls_are_timed_and_counted_in_flight_per_server():
    client = TritonClient("127.0.0.1:1")  # no server: the gRPC call itself is replaced
    seen_in_flight: list[float] = []
    gauge = ("triton_calls_in_flight", (("server", "127.0.0.1:1"),))
    count = ("triton_call_duration_seconds_count", (("model", "m"), ("server", "127.0.0.1:1")))

    def fake_infer(*args, **kwargs):
        seen_in_flight.append(_process_samples()[gauge])
        result = mock.Mock()
        result.as_numpy.return_value = np.zeros((1, 2), dtype=np.float32)
        return result

    before = _process_samples().get(count, 0.0)
    with mock.patch.object(client._client, "infer", side_effect=fake_infer):
        client.infer("m", {"INPUT0": np.zeros((1, 2), dtype=np.float32)}, ["OUTPUT0"])
    refused = mock.patch.object(client._client, "infer", side_effect=ConnectionError("refused"))
    with refused, pytest.raises(TransientTritonError):
        client.infer("m", {"INPUT0": np.zeros((1, 2), dtype=np.float32)}, ["OUTPUT0"])
    samples = _process_samples()
    assert seen_in_flight == [1.0]
    assert samples[gauge] == 0.0  # failed calls leave the gauge too
    assert samples[count] - before == 2  # failed calls are timed too
    client.close()


def _process_samples() -> Samples:
    from prometheus_client import REGISTRY

    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in REGISTRY.collect() for s in family.samples}


def test_quota_rejections_by_limit():
    key = ("quota_rejections_total", (("limit", "max_enqueued_lines"),))
    before = _process_samples().get(key, 0.0)
    response = api_exception_handler(
        QuotaExceeded("too many", limit="max_enqueued_lines", value=1, current=1, requested=1), {}
    )
    assert response is not None and response.status_code == 429
    assert _process_samples()[key] - before == 1


def test_webhook_deliveries_by_outcome(tenant, settings, monkeypatch):
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    keys = {o: ("webhook_deliveries_total", (("outcome", o),)) for o in ("succeeded", "failed")}
    before = {o: _process_samples().get(k, 0.0) for o, k in keys.items()}
    receiver = Receiver(fail_first=1, fail_status=503)
    try:
        webhook_services.webhook_endpoint_create(tenant=tenant, url=receiver.url)
        [delivery_id] = webhook_services.batch_event_emit(
            tenant_id=tenant.id, batch_id="batch_x", event_type="batch.completed"
        )
        now = timezone.now()
        assert attempts.delivery_attempt(delivery_id=delivery_id, now=now).status_code == 503
        assert attempts.delivery_attempt(delivery_id=delivery_id, now=now + timedelta(hours=1)).ok
    finally:
        receiver.close()
    after = _process_samples()
    assert {o: after[k] - before[o] for o, k in keys.items()} == {"succeeded": 1, "failed": 1}


def test_the_endpoint_needs_the_token_and_is_absent_without_one(settings):
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer anything").status_code == 404
    settings.METRICS_TOKEN = TOKEN
    assert Client().get("/metrics").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
