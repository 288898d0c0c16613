"""The fleet-size loop against real Postgres: the beat task reads real shards, stores FleetSizePlan rows and
events, and the database-gauge process exports the plan in a /metrics scrape."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from controlplane.batches import services
from controlplane.batches.models import Batch
from controlplane.core.messaging import dispatch
from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.models import CatalogueModel, FleetSizePlan, PlacementEvent
from controlplane.fleet.sizing.types import PoolLimits
from controlplane.fleet.tasks import fleet_size_plan_task
from tests.support.batches import jsonl, tensor_line, upload

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "scrape-token-for-tests"


@pytest.fixture
def sizing(settings, monkeypatch, tenant):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_DB_GAUGES = True
    settings.SCHEDULER_CALLS_PER_INSTANCE = 6
    settings.DISPATCH_INFLIGHT_CALLS = 3  # 2 slots per instance
    settings.FLEET_SCALING = replace(
        settings.FLEET_SCALING,
        pools={"default": PoolLimits("default", 0, 3)},
        drain_horizon_s=100.0,
        startup_s=30.0,
        headroom=1.0,
        hysteresis=0.2,
        scale_down_cooldown_s=60.0,
        activation_work_s=0.0,
        worker_slots=4,
        min_workers=0,
        max_workers=10,
    )
    # 10 s per work unit and slot: 2 slots per instance serve 0.2 rows/s, so 40 rows are 200 instance-s.
    CatalogueModel.objects.filter(triton_name="identity").update(seconds_per_work_unit=10.0)
    server_register(name="t0", grpc_url="127.0.0.1:1", gpu_memory_bytes=[1024**3])
    return settings


def _batch(tenant, lines: int = 40) -> Batch:
    file = upload(tenant, jsonl([tensor_line(f"r-{i}", [[1.0, 2.0]]) for i in range(lines)]))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def _scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200, response.content
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def test_the_task_stores_a_plan_per_pool_and_the_gauges_export_it(sizing, tenant):
    _batch(tenant)
    assert fleet_size_plan_task() == {"default": 2, "workers": 1}
    row = FleetSizePlan.objects.get(pool="default")
    assert (row.desired_servers, row.desired_workers) == (2, 1)
    assert row.inputs["backlog_work_seconds"] == pytest.approx(200.0)
    assert row.inputs["models"]["identity"]["work_units"] == 40
    assert row.inputs["servers"] == 1 and row.inputs["deadline_risk"] is False
    event = PlacementEvent.objects.get(action="fleet_size")
    assert (event.before, event.after) == (0, 2) and "pool default" in event.reason

    samples = _scrape()
    assert samples[("batch_fleet_desired_servers", (("pool", "default"),))] == 2
    assert samples[("batch_fleet_desired_workers", ())] == 1
    assert samples[("batch_fleet_backlog_work_seconds", (("pool", "default"),))] == pytest.approx(200.0)
    assert samples[("batch_fleet_deadline_risk", (("pool", "default"),))] == 0
    # Planning again with the same input changes nothing and records no new event.
    fleet_size_plan_task()
    assert PlacementEvent.objects.filter(action="fleet_size").count() == 1


def test_a_deadline_at_risk_scales_up_at_once_and_is_exported(sizing, tenant):
    batch = _batch(tenant)
    Batch.objects.filter(id=batch.id).update(expires_at=timezone.now() + timedelta(seconds=90))
    fleet_size_plan_task()
    row = FleetSizePlan.objects.get(pool="default")
    # 200 instance-s due in 90 s, new servers serve after 30 s: 3.3 servers, capped by the pool's max of 3.
    assert row.desired_servers == 3 and row.inputs["deadline_risk"] is True
    assert _scrape()[("batch_fleet_deadline_risk", (("pool", "default"),))] == 1


def test_an_idle_pool_goes_to_zero_after_the_cooldown(sizing, tenant):
    batch = _batch(tenant)
    fleet_size_plan_task()
    Batch.objects.filter(id=batch.id).update(status="completed")  # the work is gone
    fleet_size_plan_task()
    row = FleetSizePlan.objects.get(pool="default")
    assert row.desired_servers == 2 and row.inputs["below_since"] is not None  # cooldown running
    FleetSizePlan.objects.filter(pool="default").update(
        inputs=row.inputs | {"below_since": row.inputs["below_since"] - 61}
    )
    fleet_size_plan_task()
    assert FleetSizePlan.objects.get(pool="default").desired_servers == 0
    assert _scrape()[("batch_fleet_desired_servers", (("pool", "default"),))] == 0


def test_a_pool_with_no_server_wakes_on_its_first_work(sizing, tenant):
    CatalogueModel.objects.filter(triton_name="identity").update(pool="a100")
    fleet_size_plan_task()
    assert not FleetSizePlan.objects.filter(pool="a100").exists()  # never seen: nothing to plan
    _batch(tenant, lines=1)
    fleet_size_plan_task()
    a100 = FleetSizePlan.objects.get(pool="a100")
    # Unlisted pools take the `*` limits (default 0..4); one row is 5 instance-s: one server.
    assert a100.desired_servers == 1 and a100.inputs["servers"] == 0


def test_the_admin_lists_the_plans_with_their_reason(sizing, tenant, admin_client):
    _batch(tenant)
    fleet_size_plan_task()
    page = admin_client.get("/admin/fleet/fleetsizeplan/")
    assert page.status_code == 200
    assert "scaled up from 1" in page.content.decode()


def test_pool_limits_come_from_fleet_pools():
    from controlplane.fleet.sizing.types import parse_pools

    pools, fallback = parse_pools("default=0:4, a100=1:8,*=0:2,")
    assert pools == {"default": PoolLimits("default", 0, 4), "a100": PoolLimits("a100", 1, 8)}
    assert fallback == PoolLimits("*", 0, 2)
    for bad in ("default", "default=4", "=0:1", "a=x:1", "a=3:1", "a=-1:2"):
        with pytest.raises(ValueError):
            parse_pools(bad)
