"""The reconciler's adapter step against tinylm on a real tritonserver: adapters follow their demand on the
placed base (one slot: the demanded adapter in, the idle one out), each load and unload a PlacementEvent, the
base never reloaded; a server that cannot answer is a logged failure, not a failed run."""

from __future__ import annotations

import pytest

from controlplane.batches.models import Shard, ShardStatus
from controlplane.core.messaging import dispatch
from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.models import (
    CatalogueAdapter,
    CatalogueModel,
    Placement,
    PlacementEvent,
    PlacementStatus,
    TritonServer,
)
from controlplane.fleet.placement.adapter_apply import adapter_capacity, adapters_reconcile
from controlplane.fleet.placement.reconciler import fleet_reconcile
from controlplane.triton.lora import lora_control
from tests.fleet.test_adapter_demand import validated
from tests.support.triton_fixture import (  # fixtures and the log-tail hook
    pytest_runtest_makereport,
    triton_client,
    triton_model_repository,
    triton_server,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def placed_tinylm(triton_server, triton_client, tenant, settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.FLEET_UNLOAD_GRACE_SECONDS = 0
    triton_client.ensure_loaded("tinylm")
    server = server_register(name="t0", grpc_url=triton_server.grpc_url, gpu_memory_bytes=[4 * 1024**3])
    model = CatalogueModel.objects.get(name="tinylm")
    Placement.objects.create(model=model, server=server, gpus="0", instances=1, status=PlacementStatus.READY)
    url = triton_server.grpc_url
    yield url
    # The session's server is shared: its engine holds both adapters again, as it started.
    for name in ("double", "reverse"):
        if name not in lora_control(url, "tinylm", "list"):
            lora_control(url, "tinylm", "load", name=name)


def test_adapters_follow_demand_on_a_one_slot_instance(placed_tinylm, triton_client, tenant, settings):
    url = placed_tinylm
    settings.FLEET_ADAPTER_SLOTS = 1
    placement = Placement.objects.get(model__name="tinylm")
    first = validated(tenant, ["tinylm:reverse"] * 3)

    report = fleet_reconcile(actor="test")
    assert report.ran and not report.failures, report
    assert lora_control(url, "tinylm", "list") == ["reverse"]
    event = PlacementEvent.objects.get(action="adapter_unload")
    assert (event.ok, event.actor, event.before, event.after) == (True, "test", 2, 1)
    assert event.reason.startswith("double: over the instance's 1 adapter slots")
    assert fleet_reconcile(actor="test").changes == []  # nothing moves while demand stays

    # The reverse lines are done; double's arrive: the one slot goes to double.
    Shard.objects.filter(batch_id=first).update(status=ShardStatus.SUCCEEDED)
    validated(tenant, ["tinylm:double"] * 2)
    report = fleet_reconcile(actor="test")
    assert not report.failures, report
    assert lora_control(url, "tinylm", "list") == ["double"]
    actions = list(
        PlacementEvent.objects.filter(action__startswith="adapter").order_by("id").values_list("action", "reason")
    )
    assert [a for a, _ in actions[1:]] == ["adapter_unload", "adapter_load"]
    assert actions[1][1].startswith("reverse: slot taken by double (2 lines)")
    # The base was never reloaded: no placement change of its own, its row as it was.
    assert not PlacementEvent.objects.exclude(action__startswith="adapter").exists()
    assert Placement.objects.get(model__name="tinylm").instances == placement.instances


def test_a_server_that_cannot_answer_is_a_failure_of_the_step_not_of_the_run(placed_tinylm, tenant):
    validated(tenant, ["tinylm:reverse"])
    TritonServer.objects.filter(name="t0").update(grpc_url="127.0.0.1:1")  # nothing listens there
    report = fleet_reconcile(actor="test")
    assert report.ran
    assert any("adapter list" in failure for failure in report.failures), report


def test_an_engine_without_the_control_request_is_left_alone(placed_tinylm, triton_client, tenant):
    """vLLM's backend has no lora_control input (it serves the adapters of its multi_lora.json itself): a base
    whose served config lacks it gets no control request, and no failure."""
    triton_client.ensure_loaded("identity")
    try:
        identity = CatalogueModel.objects.get(triton_name="identity")
        CatalogueAdapter.objects.create(base=identity, name="x")
        server = TritonServer.objects.get(name="t0")
        Placement.objects.create(model=identity, server=server, gpus="0", instances=1, status=PlacementStatus.READY)
        validated(tenant, ["tinylm:reverse"])
        report = adapters_reconcile(actor="test")
        assert report.failures == [] and report.changes == []  # reverse is loaded already, no limit set
        assert not PlacementEvent.objects.filter(model=identity).exists()
    finally:
        triton_client.unload_model("identity")


def test_capacity_is_the_engines_max_loras_or_the_setting_whichever_is_set_and_smaller():
    def config(value):
        return {"parameters": {"MAX_LORAS": {"string_value": value}}}

    assert adapter_capacity({}, slots=0) is None
    assert adapter_capacity(config("0"), slots=0) is None
    assert adapter_capacity(config("4"), slots=0) == 4
    assert adapter_capacity(config(""), slots=2) == 2
    assert adapter_capacity(config("4"), slots=2) == 2
    assert adapter_capacity(config("1"), slots=3) == 1
