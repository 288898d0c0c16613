"""Triton's /metrics re-exported by the database-gauge process: the parser on a captured exposition, a dead and
a hung server that neither break nor slow the scrape, and a real tritonserver after a few inferences."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from controlplane.fleet.models import ServerState, TritonServer
from controlplane.metrics import triton_scrape
from controlplane.metrics.triton_scrape import ScrapeTarget, scrape, triton_values
from tests.support.triton_fixture import (  # pytest finds fixtures and hooks by name
    pytest_runtest_makereport,
    triton_client,
    triton_model_repository,
    triton_server,
)

TOKEN = "triton-scrape-token"

# Captured from tritonserver 2.x (CPU build) plus the GPU lines of a GPU build, a second model version and
# failure reasons; trimmed.
SAMPLE = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="identity",version="1"} 7
nv_inference_request_success{model="identity",version="2"} 3
nv_inference_request_success{model="minilm",version="1"} 2
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="identity",reason="OTHER",version="1"} 1
nv_inference_request_failure{model="identity",reason="BACKEND",version="1"} 2
nv_inference_request_failure{model="identity",reason="REJECTED",version="1"} 0
# HELP nv_inference_count Number of inferences performed (does not include cached requests)
# TYPE nv_inference_count counter
nv_inference_count{model="identity",version="1"} 40
# HELP nv_inference_queue_duration_us Cumulative inference queuing duration in microseconds
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="identity",version="1"} 2500000
nv_inference_queue_duration_us{model="identity",version="2"} 500000
# HELP nv_inference_compute_infer_duration_us Cumulative compute inference duration in microseconds
# TYPE nv_inference_compute_infer_duration_us counter
nv_inference_compute_infer_duration_us{model="minilm",version="1"} 1234567
# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting execution per-model.
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="identity",version="1"} 4
# HELP nv_pinned_memory_pool_total_bytes Pinned memory pool total memory size, in bytes
# TYPE nv_pinned_memory_pool_total_bytes gauge
nv_pinned_memory_pool_total_bytes 268435456
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-aaaa"} 0.75
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-aaaa"} 17179869184
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25
"""


def test_the_parser_renames_converts_to_seconds_and_sums_versions_and_reasons():
    values = triton_values(SAMPLE)
    requests = values["batch_triton_inference_requests"]
    assert requests[(("model", "identity"), ("outcome", "success"))] == 10  # versions 1 and 2
    assert requests[(("model", "identity"), ("outcome", "failure"))] == 3  # every reason
    assert requests[(("model", "minilm"), ("outcome", "success"))] == 2
    assert values["batch_triton_inferences"] == {(("model", "identity"),): 40}
    assert values["batch_triton_queue_seconds"] == {(("model", "identity"),): pytest.approx(3.0)}
    assert values["batch_triton_compute_seconds"] == {(("model", "minilm"),): pytest.approx(1.234567)}
    assert values["batch_triton_pending_requests"] == {(("model", "identity"),): 4}
    assert values["batch_triton_gpu_utilization_ratio"] == {(("gpu", "GPU-aaaa"),): 0.75}
    assert values["batch_triton_gpu_memory_total_bytes"] == {(("gpu", "GPU-aaaa"),): 17179869184}
    assert values["batch_triton_cpu_utilization_ratio"] == {(): 0.25}
    assert not any("pinned" in name for name in values)  # not mapped: left out


def test_the_families_follow_the_conventions():
    text = "".join(
        f"{line}\n" for family in triton_scrape.families({"gpu-1": triton_values(SAMPLE)}) for line in _lines(family)
    )
    parsed = {family.name: family for family in text_string_to_metric_families(text)}
    assert parsed["batch_triton_queue_seconds"].type == "counter"
    assert parsed["batch_triton_gpu_utilization_ratio"].type == "gauge"
    queue = parsed["batch_triton_queue_seconds"].samples[0]
    assert queue.name == "batch_triton_queue_seconds_total"
    assert queue.labels == {"server": "gpu-1", "model": "identity"}


def _lines(family) -> list[str]:
    from prometheus_client import CollectorRegistry, generate_latest

    class One:
        def collect(self):
            yield family

    registry = CollectorRegistry()
    registry.register(One())
    return generate_latest(registry).decode().splitlines()


@pytest.fixture
def hung_server():
    """Accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/metrics"


def _errors(server: str) -> float:
    from controlplane.core.observability.metrics import TRITON_SCRAPE_ERRORS

    return TRITON_SCRAPE_ERRORS.labels(server=server)._value.get()


def test_a_dead_or_hung_server_is_skipped_counted_and_does_not_slow_the_scrape(hung_server):
    before = (_errors("dead"), _errors("hung"))
    started = time.monotonic()
    before_file = _errors("file")
    result = scrape(
        [
            ScrapeTarget("dead", _closed_port_url()),
            ScrapeTarget("hung", hung_server),
            ScrapeTarget("file", "file:///etc/hostname"),  # only http(s) is ever opened
        ]
    )
    elapsed = time.monotonic() - started
    assert result == {}
    # Without the timeout the hung server holds the scrape for as long as it stays up; the margin is for a loaded
    # host (2.37 s seen in `make test` beside the chaos suite).
    assert elapsed < triton_scrape.SCRAPE_TIMEOUT_SECONDS + 3.0
    assert (_errors("dead"), _errors("hung"), _errors("file")) == (before[0] + 1, before[1] + 1, before_file + 1)


def _scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


@pytest.mark.django_db
def test_a_real_tritonserver_is_scraped_after_inferences(settings, triton_server, triton_client, hung_server):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_DB_GAUGES = True
    triton_client.ensure_loaded("identity")
    TritonServer.objects.create(name="real", grpc_url=triton_server.grpc_url, metrics_url=triton_server.metrics_url)
    TritonServer.objects.create(name="hung", grpc_url="127.0.0.1:1", metrics_url=hung_server)
    # Unhealthy servers are not scraped at all (the heartbeat already says they are away).
    TritonServer.objects.create(
        name="away", grpc_url="127.0.0.1:2", metrics_url=_closed_port_url(), state=ServerState.UNHEALTHY
    )
    labels = (("model", "identity"), ("outcome", "success"), ("server", "real"))
    before = _scrape(Client()).get(("batch_triton_inference_requests_total", labels), 0.0)
    for _ in range(5):
        triton_client.infer("identity", {"INPUT0": np.ones((3, 4), dtype=np.float32)}, ["OUTPUT0"])
    hung_errors, away_errors = _errors("hung"), _errors("away")
    started = time.monotonic()
    samples = _scrape(Client())
    assert time.monotonic() - started < triton_scrape.SCRAPE_TIMEOUT_SECONDS + 3.0  # the hung server cost ≤ 1 s
    assert samples[("batch_triton_inference_requests_total", labels)] == before + 5
    identity = (("model", "identity"), ("server", "real"))
    assert samples[("batch_triton_inferences_total", identity)] >= 15  # rows: Triton counts each batch row
    assert samples[("batch_triton_compute_seconds_total", identity)] > 0
    assert 0 < samples[("batch_triton_request_seconds_total", identity)] < 60  # seconds, not microseconds
    assert ("batch_triton_queue_seconds_total", identity) in samples
    assert ("batch_triton_pending_requests", identity) in samples
    assert ("batch_triton_cpu_utilization_ratio", (("server", "real"),)) in samples
    re_exported = [(name, dict(labels)) for name, labels in samples if name.startswith("batch_triton_")]
    assert not any(
        labels.get("server") in {"hung", "away"} for name, labels in re_exported if "scrape_errors" not in name
    )
    assert _errors("hung") == hung_errors + 1
    # The process's counters are collected before the database gauges: a scrape shows the errors of earlier ones.
    assert samples[("batch_triton_scrape_errors_total", (("server", "hung"),))] == hung_errors
    assert _errors("away") == away_errors


def test_the_fleet_reads_triton_metrics_over_http_only(tmp_path):
    """Registration and drains read a server's metrics URL through the same guarded fetch as the scrape."""
    from controlplane.fleet.membership.inventory import metrics_fetch

    secret = tmp_path / "secret"
    secret.write_text("nv_gpu_memory_total_bytes 1\n")
    with pytest.raises(OSError, match="not an http"):
        metrics_fetch(f"file://{secret}")
