"""Servers joining and leaving by themselves, against real Postgres: ``fleet_register`` / ``fleet_drain``
and ``POST /internal/fleet/servers[/<name>/drain]`` (token checks, bad bodies, idempotency), GPUs read from
Triton's metrics, and drains that wait for running shards. The drain that moves a placement to another
server runs against two real tritonservers: tests/fleet/test_membership_triton.py."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.batches.models import Shard, ShardStatus
from controlplane.fleet.membership.gpu_metrics import parse_gpu_metrics
from controlplane.fleet.membership.inventory import gpus_store, server_register
from controlplane.fleet.membership.join_leave import server_drain
from controlplane.fleet.models import CatalogueModel, Gpu, Placement, PlacementEvent, ServerState, TritonServer

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "fleet-token-for-tests"
GIB = 1024**3

# Captured from a real Triton (2.24, NGC 22.07) on a Tesla P100-PCIE-12GB, as printed by `curl :8002/metrics`
# in a public hands-on tutorial; the GPU series as Triton writes them (the CPU hosts here have no GPU, so a
# real server's /metrics has none of these lines). Only the GPU families are kept.
CAPTURED_GPU_METRICS = """\
# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)
# TYPE nv_gpu_utilization gauge
nv_gpu_utilization{gpu_uuid="GPU-a07dfe08-b87f-1f96-7083-07a26d0fa83e"} 0.000000
# HELP nv_gpu_memory_total_bytes GPU total memory, in bytes
# TYPE nv_gpu_memory_total_bytes gauge
nv_gpu_memory_total_bytes{gpu_uuid="GPU-a07dfe08-b87f-1f96-7083-07a26d0fa83e"} 12884901888.000000
# HELP nv_gpu_memory_used_bytes GPU used memory, in bytes
# TYPE nv_gpu_memory_used_bytes gauge
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a07dfe08-b87f-1f96-7083-07a26d0fa83e"} 554696704.000000
# HELP nv_gpu_power_usage GPU power usage in watts
# TYPE nv_gpu_power_usage gauge
nv_gpu_power_usage{gpu_uuid="GPU-a07dfe08-b87f-1f96-7083-07a26d0fa83e"} 33.246000
"""


@pytest.fixture
def fleet_api(settings):
    settings.FLEET_SCALING = replace(settings.FLEET_SCALING, token=TOKEN, drain_poll_s=0.05)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    return client


@pytest.fixture
def metrics_server():
    """Serves a given /metrics body on a local port; yields a setter and the URL."""
    body = {"text": ""}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body["text"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield (lambda text: body.update(text=text)), f"http://127.0.0.1:{server.server_port}/metrics"
    server.shutdown()
    server.server_close()


def _register_body(**overrides):
    body = {"name": "triton-0", "grpc_url": "10.0.0.7:8001", "http_url": "http://10.0.0.7:8000", "pool": "a100"}
    body["gpu_memory_gib"] = [16, 16]
    body.update(overrides)
    return body


# -- register ----------------------------------------------------------------------------------------------


def test_register_command_is_idempotent(db):
    args = ["--name", "triton-0", "--grpc-url", "10.0.0.7:8001", "--http-url", "http://10.0.0.7:8000"]
    call_command("fleet_register", *args, "--pool", "l4", "--gpu-memory-gib", "24", "24")
    call_command("fleet_register", *args, "--pool", "l4", "--gpu-memory-gib", "24", "24")
    server = TritonServer.objects.get()
    assert (server.name, server.grpc_url, server.http_url, server.pool, server.real_gpus) == (
        "triton-0",
        "10.0.0.7:8001",
        "http://10.0.0.7:8000",
        "l4",
        False,
    )
    assert list(server.gpus.values_list("index", "total_memory_bytes")) == [(0, 24 * GIB), (1, 24 * GIB)]
    assert PlacementEvent.objects.filter(action="server_join").count() == 1
    with pytest.raises(CommandError, match="required"):
        call_command("fleet_register", "--grpc-url", "10.0.0.8:8001", "--gpu-memory-gib", "24")
    with pytest.raises(CommandError, match="no GPU"):
        call_command("fleet_register", "--name", "triton-1", "--grpc-url", "10.0.0.8:8001")


def test_register_over_http_checks_the_token(fleet_api, settings):
    anonymous = APIClient()
    response = anonymous.post("/internal/fleet/servers", _register_body(), format="json")
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer not-the-token")
    response = anonymous.post("/internal/fleet/servers", _register_body(), format="json")
    assert response.status_code == 403 and response.json()["error"]["code"] == "invalid_token"
    settings.FLEET_SCALING = replace(settings.FLEET_SCALING, token="")  # unset: refused, whatever is sent
    assert fleet_api.post("/internal/fleet/servers", _register_body(), format="json").status_code == 403
    assert anonymous.post("/internal/fleet/servers/triton-0/drain").status_code == 403
    assert not TritonServer.objects.exists()


def test_register_over_http_is_idempotent_and_says_created_once(fleet_api):
    first = fleet_api.post("/internal/fleet/servers", _register_body(), format="json")
    assert first.status_code == 201, first.content
    assert first.json()["gpus"] == [{"index": 0, "memory_bytes": 16 * GIB}, {"index": 1, "memory_bytes": 16 * GIB}]
    again = fleet_api.post("/internal/fleet/servers", _register_body(), format="json")
    assert again.status_code == 200 and again.json() == first.json() | {"created": False}
    assert TritonServer.objects.count() == 1 and Gpu.objects.count() == 2
    moved = fleet_api.post("/internal/fleet/servers", _register_body(gpu_memory_gib=[80]), format="json")
    assert moved.status_code == 200 and Gpu.objects.get().total_memory_bytes == 80 * GIB


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "triton-0"},
        _register_body(name="has space"),
        _register_body(name="../etc"),
        _register_body(name="x" * 101),
        _register_body(grpc_url="no-port"),
        _register_body(http_url="not a url"),
        _register_body(metrics_url="ftp://x/metrics"),
        _register_body(gpu_memory_gib=[-1]),
        _register_body(gpu_memory_gib="16"),
        _register_body(gpu_memory_gib=[]),  # nothing declared and no metrics to read
        _register_body(pool="a/b"),
        _register_body(name="nul\x00"),
    ],
)
def test_register_over_http_refuses_bad_bodies(fleet_api, body):
    response = fleet_api.post("/internal/fleet/servers", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert not TritonServer.objects.exists()


def test_register_over_http_refuses_non_json_and_a_taken_address(fleet_api):
    response = fleet_api.generic("POST", "/internal/fleet/servers", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert fleet_api.post("/internal/fleet/servers", _register_body(), format="json").status_code == 201
    taken = fleet_api.post("/internal/fleet/servers", _register_body(name="triton-9"), format="json")
    assert taken.status_code == 409 and taken.json()["error"]["param"] == "grpc_url"


def test_gpus_are_read_from_a_captured_triton_gpu_exposition(fleet_api, metrics_server):
    set_body, url = metrics_server
    assert parse_gpu_metrics(CAPTURED_GPU_METRICS) == [
        {"nv_gpu_utilization": 0.0, "nv_gpu_memory_total_bytes": 12884901888.0, "nv_gpu_memory_used_bytes": 554696704.0}
    ]
    set_body(CAPTURED_GPU_METRICS)
    body = _register_body(metrics_url=url, gpu_memory_gib=[])
    response = fleet_api.post("/internal/fleet/servers", body, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["real_gpus"] is True
    gpu = Gpu.objects.get()
    assert (gpu.total_memory_bytes, gpu.used_by_others_bytes, gpu.declared) == (12884901888, 554696704, False)
    # A second GPU appears (same families, another uuid, as Triton lists each device): re-registering finds it.
    second = CAPTURED_GPU_METRICS.replace("a07dfe08", "b17dfe08")
    set_body(CAPTURED_GPU_METRICS + "\n".join(line for line in second.splitlines() if not line.startswith("#")))
    assert fleet_api.post("/internal/fleet/servers", body, format="json").status_code == 200
    assert Gpu.objects.filter(declared=False).count() == 2


def test_metrics_without_gpus_fall_back_to_declared_ones_or_refuse(fleet_api, metrics_server):
    set_body, url = metrics_server
    set_body("# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\nnv_cpu_utilization 0.25\n")
    declared = fleet_api.post("/internal/fleet/servers", _register_body(metrics_url=url), format="json")
    assert declared.status_code == 201 and declared.json()["real_gpus"] is False
    none = fleet_api.post(
        "/internal/fleet/servers",
        _register_body(name="t1", grpc_url="h:1", metrics_url=url, gpu_memory_gib=[]),
        format="json",
    )
    assert none.status_code == 400 and "no GPU" in none.json()["error"]["message"]
    gone = _register_body(name="t2", grpc_url="h:2", metrics_url="http://127.0.0.1:9/metrics", gpu_memory_gib=[])
    response = fleet_api.post("/internal/fleet/servers", gone, format="json")
    assert response.status_code == 503 and response.json()["error"]["code"] == "metrics_unavailable"


def test_gpus_listed_before_triton_measured_them_are_a_retry_not_a_refusal(fleet_api, metrics_server):
    set_body, url = metrics_server
    unmeasured = CAPTURED_GPU_METRICS.replace("12884901888.000000", "0.000000").replace("554696704.000000", "0")
    set_body(unmeasured)
    body = _register_body(metrics_url=url, gpu_memory_gib=[])
    early = fleet_api.post("/internal/fleet/servers", body, format="json")
    assert early.status_code == 503 and early.json()["error"]["code"] == "metrics_unavailable", early.content
    assert not TritonServer.objects.exists()
    # Declared sizes do not stand in for GPUs that Triton lists: a GPU host must run KIND_GPU instances.
    declared = fleet_api.post("/internal/fleet/servers", _register_body(metrics_url=url), format="json")
    assert declared.status_code == 503 and not TritonServer.objects.exists()
    set_body(CAPTURED_GPU_METRICS)
    assert fleet_api.post("/internal/fleet/servers", body, format="json").status_code == 201
    server = TritonServer.objects.get()
    # A restarted Triton lists its GPUs at 0 bytes again for a moment: the heartbeat keeps the measured rows.
    gpus_store(server, parse_gpu_metrics(unmeasured))
    assert Gpu.objects.get().total_memory_bytes == 12884901888


def test_used_by_others_leaves_out_the_planners_own_instances(fleet_api, metrics_server, catalogue):
    set_body, url = metrics_server
    set_body(CAPTURED_GPU_METRICS)
    assert (
        fleet_api.post(
            "/internal/fleet/servers", _register_body(metrics_url=url, gpu_memory_gib=[]), format="json"
        ).status_code
        == 201
    )
    server = TritonServer.objects.get()
    minilm = CatalogueModel.objects.get(triton_name="minilm")
    Placement.objects.create(model=minilm, server=server, gpus="0", instances=2, status="ready")
    Placement.objects.create(model=minilm, server=server, gpus="1", instances=1, status="ready")  # another GPU
    ours = 2 * minilm.memory_per_instance_bytes
    gpus_store(server, parse_gpu_metrics(CAPTURED_GPU_METRICS.replace("554696704.000000", f"{554696704 + ours}")))
    assert Gpu.objects.get(index=0).used_by_others_bytes == 554696704
    # Triton reporting less than the planner's estimate never makes the GPU look bigger than it is.
    gpus_store(server, parse_gpu_metrics(CAPTURED_GPU_METRICS.replace("554696704.000000", "1000")))
    assert Gpu.objects.get(index=0).used_by_others_bytes == 0


# -- drain -------------------------------------------------------------------------------------------------


def _running_shard(tenant, server_names: str) -> Shard:
    from controlplane.batches import services
    from tests.support.batches import jsonl, tensor_line, upload

    file = upload(tenant, jsonl([tensor_line("r-0", [[1.0, 2.0]])]))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    shard = Shard.objects.get(batch_id=batch.id)
    Shard.objects.filter(id=shard.id).update(
        status=ShardStatus.RUNNING,
        triton_server=server_names,
        lease_owner="worker-1",
        lease_expires_at=timezone.now() + timedelta(minutes=1),
    )
    return shard


def test_a_drain_waits_for_running_shards_then_deregisters(fleet_api, tenant, monkeypatch):
    from controlplane.core.messaging import dispatch

    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    server_register(name="t1", grpc_url="127.0.0.1:1", gpu_memory_bytes=[GIB])
    server_register(name="t10", grpc_url="127.0.0.1:2", gpu_memory_bytes=[GIB])
    shard = _running_shard(tenant, "t10,t1")
    response = fleet_api.post("/internal/fleet/servers/t1/drain?wait=0.2")
    assert response.status_code == 202, response.content
    assert response.json() | {"pending_requests": None} == {
        "object": "fleet.server.drain",
        "name": "t1",
        "state": "draining",
        "placements": 0,
        "running_shards": 1,
        "pending_requests": None,
    }
    assert TritonServer.objects.get(name="t1").state == ServerState.DRAINING  # cordoned: no new calls routed
    # A shard that only ever had t10 among its routes does not hold up t1 (names are matched whole).
    Shard.objects.filter(id=shard.id).update(triton_server="t10")
    response = fleet_api.post("/internal/fleet/servers/t1/drain?wait=5")
    assert response.status_code == 200 and response.json()["state"] == "drained"
    assert list(TritonServer.objects.values_list("name", flat=True)) == ["t10"]
    assert PlacementEvent.objects.filter(action="server_leave", reason__contains="t1 drained").exists()
    # Idempotent: draining it again (or a name never registered) answers drained.
    assert fleet_api.post("/internal/fleet/servers/t1/drain").status_code == 200
    assert fleet_api.post("/internal/fleet/servers/never-seen/drain?wait=1").status_code == 200


def test_a_dead_workers_shard_does_not_hold_a_drain(tenant, monkeypatch):
    from controlplane.core.messaging import dispatch

    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    server_register(name="t1", grpc_url="127.0.0.1:1", gpu_memory_bytes=[GIB])
    shard = _running_shard(tenant, "t1")
    assert not server_drain(name="t1", actor="test").drained
    Shard.objects.filter(id=shard.id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert server_drain(name="t1", actor="test").drained


def test_a_drain_keeps_a_server_with_placements_and_times_out(fleet_api, catalogue, monkeypatch):
    from controlplane.fleet.management.commands import fleet_drain
    from controlplane.fleet.models import CatalogueModel

    server = server_register(name="t1", grpc_url="127.0.0.1:1", gpu_memory_bytes=[GIB])
    Placement.objects.create(
        model=CatalogueModel.objects.get(triton_name="identity"), server=server, gpus="0", instances=1
    )
    from controlplane.core.messaging import dispatch

    # No placement loop here (it has its own tests, and the move itself is test_membership_triton.py's).
    monkeypatch.setattr(fleet_drain, "fleet_reconcile", lambda **kwargs: None)
    enqueued: list[dict] = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: enqueued.append((task_name, args)))
    response = fleet_api.post("/internal/fleet/servers/t1/drain?wait=0.1")
    assert response.status_code == 202 and response.json()["placements"] == 1
    assert enqueued == [("fleet.reconcile", ["fleet_api:drain"])], "the models move now, not at beat's next reconcile"

    def broker_down(task_name, args):
        raise OSError("[Errno 111] Connection refused")

    monkeypatch.setattr(dispatch, "send", broker_down)
    assert fleet_api.post("/internal/fleet/servers/t1/drain").status_code == 202
    with pytest.raises(CommandError, match="still draining") as failure:
        call_command("fleet_drain", "--name", "t1", "--timeout", "0.1")
    assert failure.value.returncode == 1
    assert TritonServer.objects.filter(name="t1").exists()
    # The orchestrator restarted the server under the same name: registration ends the drain.
    call_command("fleet_register", "--name", "t1", "--grpc-url", "127.0.0.1:1", "--gpu-memory-gib", "1")
    assert TritonServer.objects.get(name="t1").state == ServerState.HEALTHY


@pytest.mark.parametrize("wait", ["-1", "abc", "nan", "inf", "61"])
def test_a_drain_refuses_a_bad_wait(fleet_api, wait):
    response = fleet_api.post(f"/internal/fleet/servers/t1/drain?wait={wait}")
    assert response.status_code == 400 and response.json()["error"]["param"] == "wait"
