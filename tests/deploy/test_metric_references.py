"""Every metric the alert rules, the Grafana dashboard and the KEDA Prometheus trigger query is one the
service exports, cross-checked against a real scrape of `/metrics` after a batch ran (and Triton's own names
against a real tritonserver's scrape); the KEDA postgresql trigger's SQL counts what scheduling counts."""

from __future__ import annotations

import json
import urllib.request
from datetime import timedelta

import numpy as np
import pytest
import yaml
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.batches import services
from controlplane.batches.models import Batch, Shard, ShardStatus
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.selectors import runnable_q
from tests.deploy.manifests import DEPLOY, REPO, find, promql_metric_names, render
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard
from tests.support.triton_fixture import triton_client, triton_model_repository, triton_server

TOKEN = "deploy-scrape-token"
# Prometheus' own series: `up` per scrape target.
PROMETHEUS_BUILTINS = {"up"}
# Triton's GPU metrics exist only on GPU hosts (the tritonserver here runs on CPU); the fleet's inventory
# already parses exactly these names from real GPU hosts (controlplane/fleet/membership/inventory.py).
TRITON_GPU_ONLY = {"nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"}


def _sample_names(exposition: str) -> set[str]:
    """The series names Prometheus stores from a classic text scrape: every sample line's name, and for
    families without samples yet the names their `# TYPE` line announces (the name as written: Triton's
    counters carry no `_total`, prometheus-client's do; histograms add their suffixes)."""
    names = set()
    for family in text_string_to_metric_families(exposition):  # the exposition parses as Prometheus' does
        names |= {sample.name for sample in family.samples}
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            names |= {name + s for s in ("_bucket", "_count", "_sum")} if kind in ("histogram", "summary") else {name}
    return names


@pytest.fixture
def service_metric_names(db, tenant, settings, monkeypatch, tmp_path) -> set[str]:
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_DB_GAUGES = True
    file = upload(tenant, jsonl([embedding_line(f"r{i}", f"sentence {i}") for i in range(6)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    first = Shard.objects.filter(batch_id=batch.id).order_by("index").first()
    assert first is not None
    backend = FakeBackend()
    assert run_shard(first, backend) == "succeeded"
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    names = _sample_names(response.content.decode())
    assert {"batch_lines_completed_total", "batch_lines_runnable", "shard_duration_seconds_bucket"} <= names
    return names


@pytest.fixture(scope="module")
def triton_metric_names(triton_server, triton_client) -> set[str]:
    """A real tritonserver's /metrics after one inference (per-model families appear once a model loads)."""
    triton_client.ensure_loaded("identity")
    triton_client.infer("identity", {"INPUT0": np.ones((1, 4), dtype=np.float32)}, ["OUTPUT0"])
    with urllib.request.urlopen(triton_server.metrics_url, timeout=10) as response:
        names = _sample_names(response.read().decode())
    assert "nv_inference_request_success" in names
    return names


def _queries() -> dict[str, str]:
    """Every PromQL expression this repository ships, by where it is."""
    queries = {}
    for group in yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            queries[f"alert {rule['alert']}"] = rule["expr"]
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "controlplane.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            queries[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        queries[f"variable {variable['name']}"] = variable["definition"].removeprefix("label_values(").split(",")[0]
    for overlay in ("dev", "gpu-prod"):
        scaled = find(render(overlay), "ScaledObject", "triton")
        queries[f"keda {overlay} triton"] = scaled["spec"]["triggers"][0]["metadata"]["query"]
    return queries


def test_the_dashboard_covers_what_operators_watch():
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "controlplane.json").read_text())
    used = set().union(*(promql_metric_names(q) for q in _queries().values()))
    for name in ("batch_lines_runnable", "batch_lines_completed_total", "shard_duration_seconds_bucket",
                 "triton_call_duration_seconds_bucket", "triton_server_breaker_open", "batch_shards_dead",
                 "webhook_deliveries_total", "batch_fleet_desired_servers"):  # fmt: skip
        assert name in used, name
    datasources = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p.get("targets", [])}
    provisioned = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert datasources == {d["uid"] for d in provisioned["datasources"]}
    # Grafana's layout rules: unique ids, panels inside the 24-column grid, every query panel with a query.
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["type"] == "row" or all(t["expr"].strip() for t in panel["targets"]), panel["title"]


@pytest.mark.django_db(transaction=True)
def test_every_queried_metric_is_exported(service_metric_names, triton_metric_names):
    exported = service_metric_names | triton_metric_names | PROMETHEUS_BUILTINS
    inventory = (REPO / "controlplane" / "fleet" / "membership" / "inventory.py").read_text()
    assert all(name in inventory for name in TRITON_GPU_ONLY)
    unknown = {}
    for where, expr in _queries().items():
        names = promql_metric_names(expr)
        assert names, where  # the extractor found something to check
        missing = names - exported - TRITON_GPU_ONLY
        if missing:
            unknown[where] = sorted(missing)
    assert unknown == {}
    # The checks can fail: a misspelt name is caught.
    assert promql_metric_names("sum(rate(batch_lines_complete_total[5m]))") - exported == {"batch_lines_complete_total"}


@pytest.mark.django_db(transaction=True)
def test_the_keda_worker_query_counts_runnable_and_running_shards(tenant, settings, monkeypatch):
    from django.db import connection

    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 2
    query = find(render("gpu-prod"), "ScaledObject", "controlplane-worker-shards")["spec"]["triggers"][0]
    sql = query["metadata"]["query"]

    def keda_count() -> int:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            return int(cursor.fetchone()[0])

    def orm_count() -> int:
        now = timezone.now()
        paused = CatalogueModel.objects.filter(paused=True).values_list("name", flat=True)
        runnable = Shard.objects.filter(runnable_q(now)).exclude(batch__model__in=list(paused)).count()
        return runnable + Shard.objects.filter(status=ShardStatus.RUNNING).count()

    assert keda_count() == 0
    file = upload(tenant, jsonl([embedding_line(f"r{i}", f"s {i}") for i in range(10)]))
    batch = services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    shards = list(Shard.objects.filter(batch_id=batch.id).order_by("index"))
    assert len(shards) == 5
    assert keda_count() == orm_count() == 5
    Shard.objects.filter(id=shards[0].id).update(status=ShardStatus.RUNNING)
    Shard.objects.filter(id=shards[1].id).update(status=ShardStatus.SUCCEEDED)
    Shard.objects.filter(id=shards[2].id).update(not_before=timezone.now() + timedelta(minutes=5))
    assert keda_count() == orm_count() == 3
    CatalogueModel.objects.filter(name=Batch.objects.get(id=batch.id).model).update(paused=True)
    assert keda_count() == orm_count() == 1  # only the running one
    CatalogueModel.objects.update(paused=False)
    tenant.paused = True
    tenant.save(update_fields=["paused"])
    assert keda_count() == orm_count() == 1
