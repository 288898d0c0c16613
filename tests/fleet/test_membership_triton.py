"""A drain against two real tritonservers: the drained server's placement moves to the other one
(make-before-break, by the placement loop), its calls in flight are counted from Triton's own metrics, and
only then is it deregistered. Registration with a real server's metrics URL: a CPU host's Triton exports
no GPU series, so the declared GPUs are used (the GPU series are parsed from a captured sample in
test_membership.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from controlplane.batches import services
from controlplane.core.messaging import dispatch
from controlplane.fleet.membership.inventory import metrics_fetch
from controlplane.fleet.membership.join_leave import server_drain
from controlplane.fleet.models import Placement, PlacementEvent, PlacementStatus, ServerState, TritonServer
from controlplane.fleet.placement.reconciler import fleet_reconcile
from controlplane.triton.client import TritonClient
from deploy.local.triton_server import running_local_server
from tests.support.batches import jsonl, tensor_line, upload
from tests.support.triton_fixture import pytest_runtest_makereport, triton_model_repository, triton_server

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "fleet-token-for-tests"


@pytest.fixture
def second_triton(triton_model_repository, tmp_path):
    with running_local_server(triton_model_repository, log_path=tmp_path / "second.log") as server:
        yield server


@pytest.fixture
def two_servers(triton_server, second_triton, tenant, settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.FLEET_UNLOAD_GRACE_SECONDS = 0
    settings.FLEET_SCALING = replace(settings.FLEET_SCALING, token=TOKEN, drain_poll_s=0.2)
    clients = [TritonClient(triton_server.grpc_url), TritonClient(second_triton.grpc_url)]
    yield triton_server, second_triton
    for client in clients:  # the session's server is shared: leave it empty
        if client.is_model_ready("identity"):
            client.unload_model("identity")
        client.close()


def _register(name: str, server) -> None:
    call_command(
        "fleet_register",
        "--name",
        name,
        "--grpc-url",
        server.grpc_url,
        "--http-url",
        server.http_url,
        "--metrics-url",
        server.metrics_url,
        "--gpu-memory-gib",
        "1",
    )


def _demand(tenant) -> None:
    file = upload(tenant, jsonl([tensor_line(f"r-{i}", [[1.0, 2.0]]) for i in range(20)]))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)


def test_register_from_a_real_servers_metrics_on_a_cpu_host(two_servers):
    first, _ = two_servers
    text = metrics_fetch(first.metrics_url)
    assert "nv_gpu_memory_total_bytes" not in text  # no GPU here: the declared size is used
    _register("a", first)
    server = TritonServer.objects.get(name="a")
    assert (server.real_gpus, server.metrics_url, list(server.gpus.values_list("total_memory_bytes", flat=True))) == (
        False,
        first.metrics_url,
        [1024**3],
    )


def test_a_drain_moves_the_placement_to_the_other_server_then_deregisters(two_servers, tenant):
    first, second = two_servers
    _register("a", first)
    _demand(tenant)
    assert not fleet_reconcile(actor="test").failures
    assert list(Placement.objects.values_list("server__name", "status")) == [("a", PlacementStatus.READY)]
    _register("b", second)
    # Triton itself reports the calls it holds: the drain reads that count (0 here: nothing is running).
    assert server_drain(name="a", actor="test").pending_requests == 0
    assert "nv_inference_pending_request_count" in metrics_fetch(first.metrics_url)

    call_command("fleet_drain", "--name", "a", "--timeout", "120")

    assert list(TritonServer.objects.values_list("name", flat=True)) == ["b"]
    placement = Placement.objects.get()
    assert (placement.server.name, placement.status) == ("b", PlacementStatus.READY)
    with TritonClient(second.grpc_url) as on_b, TritonClient(first.grpc_url) as on_a:
        assert on_b.is_model_ready("identity") and not on_a.is_model_ready("identity")
    actions = list(PlacementEvent.objects.order_by("created_at", "id").values_list("action", "server__name"))
    # Cordon, then load on b before the unload on a (make-before-break), then the server leaves.
    assert actions.index(("server_draining", None)) < actions.index(("load", "b")) < actions.index(("unload", None))
    assert actions[-1] == ("server_leave", None)


def test_a_drain_over_http_answers_202_until_the_placement_moved(two_servers, tenant, monkeypatch):
    from controlplane.core.messaging import dispatch

    enqueued: list[str] = []

    def send(task_name, args):
        if task_name == dispatch.FLEET_RECONCILE:
            enqueued.append(args[0])

    monkeypatch.setattr(dispatch, "send", send)
    first, second = two_servers
    _register("a", first)
    _demand(tenant)
    fleet_reconcile(actor="test")
    _register("b", second)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    response = client.post("/internal/fleet/servers/a/drain?wait=0.5")
    assert response.status_code == 202 and response.json()["placements"] == 1
    assert TritonServer.objects.get(name="a").state == ServerState.DRAINING
    assert enqueued == ["fleet_api:drain"]
    fleet_reconcile(actor=enqueued[0])  # what the worker does with it, at once rather than at beat's next tick
    response = client.post("/internal/fleet/servers/a/drain?wait=10")
    assert response.status_code == 200, response.content
    assert response.json()["state"] == "drained" and response.json()["pending_requests"] == 0
    assert Placement.objects.get().server.name == "b"
