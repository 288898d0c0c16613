"""The reconciler against a real tritonserver: loads what demand asks for, records events, notices a
model that disappeared, and marks a failing load without crashing the loop."""

from __future__ import annotations

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch
from controlplane.core.messaging import dispatch
from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.models import CatalogueModel, Placement, PlacementEvent, PlacementStatus
from controlplane.fleet.placement.reconciler import fleet_reconcile
from controlplane.triton.client import TritonClient
from tests.support.batches import jsonl, tensor_line, upload
from tests.support.triton_fixture import pytest_runtest_makereport, triton_model_repository, triton_server

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fleet(triton_server, tenant, monkeypatch, settings):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.FLEET_UNLOAD_GRACE_SECONDS = 0
    server = server_register(name="t0", grpc_url=triton_server.grpc_url, gpu_memory_bytes=[1024**3])
    client = TritonClient(triton_server.grpc_url)
    yield server, client
    for name in ("identity", "scale2"):
        if client.is_model_ready(name):
            client.unload_model(name)
    client.close()


def _demand(tenant, model: str, lines: int = 40) -> Batch:
    file = upload(tenant, jsonl([tensor_line(f"{model}-{i}", [[1.0, 2.0]], model=model) for i in range(lines)]))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    return batch


def test_demand_loads_the_model_and_records_events(fleet, tenant):
    server, client = fleet
    _demand(tenant, "identity")
    report = fleet_reconcile(actor="test")
    assert report.ran and not report.failures, report
    placement = Placement.objects.get(model__triton_name="identity", server=server)
    assert placement.status == PlacementStatus.READY and placement.instances >= 1
    assert client.is_model_ready("identity")
    event = PlacementEvent.objects.get(model__triton_name="identity", action="load")
    assert event.ok and event.actor == "test" and event.after == placement.instances
    # Planning again with nothing changed moves nothing.
    assert fleet_reconcile(actor="test").changes == []


def test_a_cpu_server_loads_the_configs_kind_cpu_count_per_placed_instance(fleet, tenant, monkeypatch):
    """A config asking for two CPU instances (as MiniLM's does) gets two Triton instances per placed one."""
    from controlplane.fleet.placement import reconciler

    real = reconciler.repository_model_config

    def two_cpu_instances(repository, name):
        config = real(repository, name)
        config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
        return config

    monkeypatch.setattr(reconciler, "repository_model_config", two_cpu_instances)
    server, client = fleet
    _demand(tenant, "identity")
    assert fleet_reconcile(actor="test").failures == []
    placement = Placement.objects.get(model__triton_name="identity", server=server)
    loaded = client.model_config("identity")["instance_group"]
    assert sum(int(g.get("count", 1)) for g in loaded) == 2 * placement.instances


def test_a_model_unloaded_behind_our_back_is_noticed_and_reloaded(fleet, tenant):
    _server, client = fleet
    _demand(tenant, "identity")
    fleet_reconcile()
    client.unload_model("identity")
    fleet_reconcile()
    assert PlacementEvent.objects.filter(action="lost", ok=False).exists()
    assert client.is_model_ready("identity")


def test_a_failing_load_marks_the_placement_failed(fleet, tenant):
    CatalogueModel.objects.filter(triton_name="scale2").update(triton_name="no_such_model")
    _demand(tenant, "scale2")
    report = fleet_reconcile()
    assert report.failures and "no_such_model" in report.failures[0]
    placement = Placement.objects.get(model__triton_name="no_such_model")
    assert placement.status == PlacementStatus.FAILED and placement.failed_until is not None
    assert PlacementEvent.objects.filter(action="load", ok=False).exists()
    assert fleet_reconcile().failures == []  # backed off: not retried on that server at once


def test_failed_loads_in_a_row_back_off_longer_and_a_good_load_starts_over(fleet, tenant):
    from datetime import timedelta

    from django.utils import timezone

    server, client = fleet
    CatalogueModel.objects.filter(triton_name="scale2").update(triton_name="no_such_model")
    _demand(tenant, "scale2")
    backoffs = []
    for _ in range(3):
        before = timezone.now()
        assert fleet_reconcile().failures
        placement = Placement.objects.get(model__triton_name="no_such_model", server=server)
        backoffs.append(round((placement.failed_until - before).total_seconds()))
        # The backoff has passed: the next reconcile tries that server again.
        Placement.objects.filter(id=placement.id).update(failed_until=timezone.now() - timedelta(seconds=1))
    assert placement.load_failures == 3
    assert backoffs == [10, 20, 40]
    # The model's repository entry is fixed: the next load succeeds and the count starts over.
    CatalogueModel.objects.filter(triton_name="no_such_model").update(triton_name="scale2")
    report = fleet_reconcile()
    assert not report.failures, report
    placement = Placement.objects.get(model__triton_name="scale2", server=server)
    assert (placement.status, placement.load_failures, placement.failed_until) == (PlacementStatus.READY, 0, None)
    assert client.is_model_ready("scale2")


def test_the_load_failure_backoff_doubles_from_10_s_up_to_2_min():
    from controlplane.fleet.placement.load_failures import load_failure_backoff

    assert [load_failure_backoff(n).total_seconds() for n in range(1, 8)] == [10, 20, 40, 80, 120, 120, 120]
    assert load_failure_backoff(10**6).total_seconds() == 120


def test_a_recent_failed_load_is_passed_to_the_planner_as_a_server_to_avoid(catalogue):
    import time
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.fleet.placement.reconciler import planner_inputs

    server = server_register(name="t-oom", grpc_url="127.0.0.1:1", gpu_memory_bytes=[1024**3])
    model = CatalogueModel.objects.get(triton_name="identity")
    Placement.objects.create(
        model=model,
        server=server,
        gpus="0",
        instances=0,
        status=PlacementStatus.FAILED,
        failed_until=timezone.now() + timedelta(minutes=1),
    )
    profiles = {p.model: p for p in planner_inputs(time.time())[3]}
    assert profiles["identity"].avoid_servers == ("t-oom",)
    assert profiles["scale2"].avoid_servers == ()


def test_pools_reach_the_planner(catalogue):
    import time

    from controlplane.fleet.models import TritonServer
    from controlplane.fleet.placement.reconciler import planner_inputs

    server_register(name="t-t4", grpc_url="127.0.0.1:2", gpu_memory_bytes=[1024**3])
    TritonServer.objects.filter(name="t-t4").update(pool="t4")
    CatalogueModel.objects.filter(triton_name="identity").update(pool="t4")
    _, servers, _, profiles, _, _ = planner_inputs(time.time())
    assert [s.pool for s in servers if s.server_id == "t-t4"] == ["t4"]
    assert {p.model: p.pool for p in profiles}["identity"] == "t4"


def test_the_planner_rate_comes_from_the_one_speed_estimate(tenant, settings, monkeypatch):
    """The planner's lines/s per instance is derived from the scheduler's measured seconds per work unit (per
    slot), at the pending lines' own work units per line; there is no second estimate to disagree with it."""
    import time

    from controlplane.fleet.placement.reconciler import planner_inputs

    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SCHEDULER_CALLS_PER_INSTANCE = 6
    settings.DISPATCH_INFLIGHT_CALLS = 3  # 2 slots per instance
    CatalogueModel.objects.filter(triton_name="identity").update(seconds_per_work_unit=0.5)  # a slot: 2 rows/s
    file = upload(tenant, jsonl([tensor_line(f"r-{i}", [[1.0, 2.0]] * 4) for i in range(10)]))  # 4 rows a line
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)

    def identity_demand():
        return {d.model: d for d in planner_inputs(time.time())[0]}["identity"]

    # 2 slots × 2 rows/s = 4 rows/s an instance; at 4 rows a line, 1 line/s.
    assert identity_demand().pending_lines == 10
    assert identity_demand().lines_per_second_per_instance == pytest.approx(1.0)
    CatalogueModel.objects.filter(triton_name="identity").update(seconds_per_work_unit=0.25)  # measured faster
    assert identity_demand().lines_per_second_per_instance == pytest.approx(2.0)
    # No speed known: 0, which the planner reads as "busy without a throughput estimate" (size kept).
    CatalogueModel.objects.filter(triton_name="identity").update(seconds_per_work_unit=0.0)
    assert identity_demand().lines_per_second_per_instance == 0.0


def test_consolidation_moves_make_before_break_then_loads_the_model_it_made_room_for(fleet, tenant):
    """Two declared 256 MiB GPUs: something else holds 100 MiB of GPU 0 and identity (100 MiB) sits on GPU 1,
    so scale2 (200 MiB) fits on neither. The reconciler moves identity to GPU 0 (new instance ready before
    the old one goes), then loads scale2 on GPU 1; events and the metric record the move."""
    from controlplane.core.observability.metrics import CONSOLIDATION_MOVES
    from controlplane.fleet.models import Gpu

    server, client = fleet
    mib = 1024**2
    server_register(name="t0", grpc_url=server.grpc_url, gpu_memory_bytes=[256 * mib, 256 * mib])
    Gpu.objects.filter(server=server, index=0).update(used_by_others_bytes=100 * mib)
    models = CatalogueModel.objects.filter(triton_name__in=("identity", "scale2"))
    # Slow declared speed: a 40-line backlog then outlasts the (zero) load times, so the moves pay back.
    models.update(seconds_per_work_unit=10.0, max_instances=1)
    CatalogueModel.objects.filter(triton_name="identity").update(memory_per_instance_bytes=100 * mib, pin_gpus=[1])
    CatalogueModel.objects.filter(triton_name="scale2").update(memory_per_instance_bytes=200 * mib)
    _demand(tenant, "identity")
    assert fleet_reconcile(actor="test").failures == []
    assert list(Placement.objects.filter(model__triton_name="identity").values_list("gpus", flat=True)) == ["1"]
    models.update(load_seconds=0.0)
    CatalogueModel.objects.filter(triton_name="identity").update(pin_gpus=[])
    before = CONSOLIDATION_MOVES.labels("identity", "ok")._value.get()
    _demand(tenant, "scale2")
    report = fleet_reconcile(actor="test")
    assert report.failures == [], report
    placed = {(p.model.triton_name, p.gpus, p.status) for p in Placement.objects.select_related("model")}
    assert placed == {("identity", "0", PlacementStatus.READY), ("scale2", "1", PlacementStatus.READY)}
    assert client.is_model_ready("identity") and client.is_model_ready("scale2")
    events = list(PlacementEvent.objects.order_by("id").filter(move_for="scale2").values_list("action", "gpus", "ok"))
    assert events == [("consolidate", "1", True), ("move_in", "0", True), ("move_out", "1", True)], events
    load = PlacementEvent.objects.get(model__triton_name="scale2", action="load")
    assert load.id > PlacementEvent.objects.get(action="move_out").id  # loaded only after the memory was freed
    assert CONSOLIDATION_MOVES.labels("identity", "ok")._value.get() == before + 1
    # The next plan keeps it so: identity is in its cooldown and scale2 is placed.
    assert fleet_reconcile(actor="test").changes == []


def test_a_reconcile_that_dies_on_a_closed_connection_still_gives_its_lease_back(catalogue, monkeypatch):
    """Postgres restarting under a reconcile closes its connection: the run fails, and its lease is given back
    on a new connection (left held, no reconcile ran for FLEET_RECONCILE_LOCK_SECONDS, 5 min)."""
    from django.db import DatabaseError, connection

    from controlplane.fleet.models import FleetLock
    from controlplane.fleet.placement import reconciler

    def database_restarted(servers):
        assert FleetLock.objects.get(name="reconcile").expires_at is not None  # the run holds the lease
        with connection.cursor() as cursor:  # the server ends this connection, as a restart does
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    monkeypatch.setattr(reconciler, "_sync_actual_state", database_restarted)
    with pytest.raises(DatabaseError):
        fleet_reconcile(actor="test")
    connection.close()
    lock = FleetLock.objects.get(name="reconcile")
    assert (lock.expires_at, lock.holder) == (None, "")
    monkeypatch.undo()
    assert fleet_reconcile(actor="test").ran  # and the next run gets it at once
