"""Observability of a real run: a stack of its own with JSON logs and metrics on (LOG_FORMAT=json, METRICS_TOKEN,
a WORKER_METRICS_PORT and a PROMETHEUS_MULTIPROC_DIR per process) and its own Triton registered as a managed
server with its metrics URL, one batch through the openai SDK, then the web and worker expositions parsed as
Prometheus would (Triton's own counters re-exported among them), and every log line of every process read
as JSON.

Its own stack, not the session's: other suites kill processes on purpose, and their logs are theirs. Its own
Redis database too (E2E_OBS_BROKER_URL), so it never consumes the session stack's messages."""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from deploy.local.databases import migrated_database
from deploy.local.stack import Stack, find_free_port
from tests.e2e.conftest import E2E, broker_env
from tests.support.stack import submit, tensor_lines
from tests.support.stack_tenants import tenant_key

pytestmark = pytest.mark.e2e

TOKEN = "obs-scrape-token"
WORKERS = ("worker", "control", "validation", "housekeeping", "webhooks")
PROCESSES = ("web", *WORKERS, "beat")


# A Redis database no other suite or benchmark uses (the session stack has 14, the Makefile's tests 15).
OBS_BROKER_URL = os.environ.get("E2E_OBS_BROKER_URL", "redis://127.0.0.1:6379/10")


class ObservedStack(E2E):
    def __init__(self, stack: Stack, db_url: str, api_key: str, worker_ports: dict[str, int]):
        super().__init__(stack, db_url, api_key)
        self.worker_ports = worker_ports

    def log_entries(self, name: str) -> list[dict]:
        lines = (self.stack.log_dir / f"{name}.log").read_text().splitlines()
        entries = []
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                pytest.fail(f"{name}.log line {number} is not JSON: {line[:300]!r}")
            assert isinstance(entry, dict), line
            entries.append(entry)
        return entries


@pytest.fixture(scope="module")
def observed(tmp_path_factory) -> Iterator[ObservedStack]:
    with migrated_database("cp_obs") as db_url:
        yield from _observed_stack(tmp_path_factory, db_url)


def _observed_stack(tmp_path_factory, db_url: str) -> Iterator[ObservedStack]:
    var_dir = Path(tmp_path_factory.mktemp("obs-stack"))
    ports = {name: find_free_port() for name in WORKERS}
    process_env: dict[str, dict[str, str]] = {}
    for name in ("web", *WORKERS):
        # One directory per deployment, emptied at its start (a fresh tmp dir here): see core/observability/metrics.py.
        directory = var_dir / "prometheus" / name
        directory.mkdir(parents=True)
        process_env[name] = {"PROMETHEUS_MULTIPROC_DIR": str(directory)}
        if name in ports:
            process_env[name]["WORKER_METRICS_PORT"] = str(ports[name])
    process_env["web"]["METRICS_DB_GAUGES"] = "1"
    env = {
        "DATABASE_URL": db_url,
        **broker_env(OBS_BROKER_URL),
        "SHARD_MAX_LINES": "16",
        "LOG_FORMAT": "json",
        "METRICS_TOKEN": TOKEN,
    }
    stack = Stack(
        var_dir=var_dir,
        web_port=find_free_port(),
        env=env,
        process_env=process_env,
        worker_concurrency=2,
        # The runner's own Triton, registered (as `local`) with its metrics URL: the scrape reads it.
        with_triton=True,
        warm_models=("identity",),
    )
    stack.start()
    try:
        key = tenant_key(db_url, "obs-tenant")
        yield ObservedStack(stack, db_url, key, ports)
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def finished_batch(observed: ObservedStack):
    client = observed.sdk()
    lines = tensor_lines(40, prefix="obs")
    batch = submit(client, lines, endpoint="/v2/infer")
    batch = observed.wait_status(client, batch.id, {"completed", "failed", "expired", "cancelled"})
    assert batch.status == "completed", batch
    assert batch.request_counts.completed == 40
    return batch


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=")
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _parse(text: str) -> tuple[set[str], Samples]:
    families, samples = set(), {}
    for family in text_string_to_metric_families(text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return families, samples


def _sum(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def test_metrics_after_a_real_batch(observed: ObservedStack, finished_batch):
    web_metrics = f"{observed.stack.base_url}/metrics"
    assert _get(web_metrics)[0] == 401
    assert _get(web_metrics, "wrong-token")[0] == 401
    status, web_text = _get(web_metrics, TOKEN)
    assert status == 200
    web_families, web_samples = _parse(web_text)
    # The database gauges are served by the one process that has METRICS_DB_GAUGES=1.
    assert {"batch_shards_runnable", "batch_oldest_runnable_age_seconds", "triton_server_breaker_open"} <= web_families
    assert _sum(web_samples, "batch_shards_runnable") == 0  # the batch is done: nothing waits

    texts = {"web": web_text}
    for name, port in observed.worker_ports.items():
        status, texts[name] = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200, name
    _, shard_samples = _parse(texts["worker"])
    shards = observed.sql("SELECT count(*) FROM batches_shard WHERE batch_id = %s", finished_batch.id)[0][0]
    assert shards >= 3  # 40 lines, at most 16 per shard
    # Summed over the prefork pool's processes by the worker's main process (multiprocess mode).
    assert _sum(shard_samples, "batch_lines_completed_total", model="identity") == 40
    assert _sum(shard_samples, "batch_lines_failed_total", model="identity") == 0
    # One committed attempt per shard: each shard observed exactly once.
    assert _sum(shard_samples, "shard_duration_seconds_count", model="identity") == shards
    assert _sum(shard_samples, "shard_duration_seconds_sum", model="identity") > 0
    calls = _sum(shard_samples, "triton_call_duration_seconds_count", model="identity")
    assert calls >= 1
    assert _sum(shard_samples, "triton_call_duration_seconds_bucket", model="identity", le="+Inf") == calls
    assert _sum(shard_samples, "triton_calls_in_flight") == 0

    # Triton's own counters, re-exported by the gauge process: it answered at least our calls, and spent
    # measurable compute on them.
    _, web_samples = _parse(_get(web_metrics, TOKEN)[1])
    server = {"server": observed.stack.triton_server_name, "model": "identity"}
    assert _sum(web_samples, "batch_triton_inference_requests_total", outcome="success", **server) >= calls
    assert _sum(web_samples, "batch_triton_inferences_total", **server) >= 40  # one row per line
    assert _sum(web_samples, "batch_triton_compute_seconds_total", **server) > 0
    assert ("batch_triton_queue_seconds_total", tuple(sorted(server.items()))) in web_samples
    assert _sum(web_samples, "batch_triton_scrape_errors_total") == 0
    assert _sum(web_samples, "fleet_placements", status="ready", **server) == 1

    # No tenant, batch or file id in any label of any process.
    tenant_id = observed.sql("SELECT tenant_id FROM batches_batch WHERE id = %s", finished_batch.id)[0][0]
    forbidden = {finished_batch.id, finished_batch.input_file_id, finished_batch.output_file_id, str(tenant_id)}
    for name, text in texts.items():
        for (_, labels), _value in _parse(text)[1].items():
            for label, label_value in labels:
                assert label_value not in forbidden, (name, label, label_value)
                assert not label_value.startswith(("batch_", "file-", "tenant")), (name, label, label_value)


def test_one_batch_story_reads_across_processes_in_json_logs(observed: ObservedStack, finished_batch):
    by_process = {name: observed.log_entries(name) for name in PROCESSES}
    for name, entries in by_process.items():
        assert entries, f"{name}.log is empty"
        for entry in entries:
            assert {"timestamp", "level", "logger", "message", "role", "pid"} <= entry.keys(), (name, entry)
    assert {e["role"] for e in by_process["web"]} == {"web"}
    assert {e["role"] for e in by_process["beat"]} == {"beat"}
    for name in WORKERS:
        assert {e["role"] for e in by_process[name]} == {"worker"}, name

    batch_id = finished_batch.id
    # web: the create and the polls, each with the request's id and the batch's
    web = [e for e in by_process["web"] if e.get("batch_id") == batch_id]
    assert any(e["message"].startswith("POST /v1/batches 200") for e in web), web
    assert all(e["request_id"].startswith("req_") for e in web)
    # the validation worker (a pool process) validated it, under the task's own name and id
    validation = [e for e in by_process["validation"] if e.get("batch_id") == batch_id]
    assert any(e.get("task") == "batches.batch_validate" and e.get("task_id") for e in validation), validation
    # the shard worker ran its shards: shard index, attempt and slot on each line about a shard
    shard_lines = [e for e in by_process["worker"] if e.get("batch_id") == batch_id]
    assert shard_lines
    assert all({"shard_id", "shard_index", "attempt", "slot"} <= e.keys() for e in shard_lines), shard_lines
    indexes = observed.sql("SELECT index FROM batches_shard WHERE batch_id = %s", batch_id)
    assert {e["shard_index"] for e in shard_lines} == {index for (index,) in indexes}
    # and beat, which knows no batch, still logs as JSON what it sends (the rescuer, the top-ups). Waited for: the
    # batch needs no beat message, and on a loaded host it once finished before beat, which started 15 s after the
    # other processes, had sent its first (a hang guard, not a speed bound).
    deadline = time.monotonic() + 120
    while not any("Sending due task" in e["message"] for e in observed.log_entries("beat")):
        assert time.monotonic() < deadline, observed.log_entries("beat")
        time.sleep(0.5)
