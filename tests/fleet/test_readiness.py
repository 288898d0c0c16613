"""Keeping models warm (`catalogue_warm`) and waiting until they are served (`fleet_wait_ready`): what the
local runner does after registering its Triton, against a real tritonserver."""

from __future__ import annotations

import time

import pytest
from django.core.management import CommandError, call_command

from controlplane.core.http.errors import NotFound, ValidationFailed
from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.models import CatalogueModel, Placement, PlacementEvent, PlacementStatus
from controlplane.fleet.placement.readiness import ModelsNotReady, fleet_wait_ready, models_not_ready
from controlplane.fleet.services import catalogue_set_min_instances
from controlplane.triton.client import TritonClient
from tests.support.triton_fixture import pytest_runtest_makereport, triton_model_repository, triton_server

pytestmark = pytest.mark.django_db(transaction=True)
WARM = ["identity", "scale2"]  # minilm takes ~15 s to load: the demo covers it


@pytest.fixture
def local(triton_server, catalogue, settings):
    settings.FLEET_UNLOAD_GRACE_SECONDS = 0
    server = server_register(name="local", grpc_url=triton_server.grpc_url, gpu_memory_bytes=[16 * 1024**3])
    client = TritonClient(triton_server.grpc_url)
    yield server, client
    for name in ("identity", "scale2"):
        if client.is_model_ready(name):
            client.unload_model(name)
    client.close()


def test_set_min_instances_records_each_change_and_is_all_or_nothing(catalogue):
    models = catalogue_set_min_instances(names=["identity", "scale2"], min_instances=1, actor="test")
    assert [m.min_instances for m in models] == [1, 1]
    events = PlacementEvent.objects.filter(action="min_instances")
    assert {(e.model.name, e.before, e.after, e.actor) for e in events} == {
        ("identity", 0, 1, "test"),
        ("scale2", 0, 1, "test"),
    }
    catalogue_set_min_instances(names=["identity"], min_instances=1, actor="test")
    assert events.count() == 2, "an unchanged floor writes no event"

    with pytest.raises(NotFound, match="nope"):
        catalogue_set_min_instances(names=["scale2", "nope"], min_instances=0, actor="test")
    with pytest.raises(ValidationFailed, match="max_instances"):
        catalogue_set_min_instances(names=["scale2", "all-MiniLM-L6-v2"], min_instances=3, actor="test")
    assert CatalogueModel.objects.get(name="scale2").min_instances == 1, "a refused call changes nothing"


def test_catalogue_warm_command(catalogue, capsys):
    call_command("catalogue_warm", "identity", "--actor", "ops")
    assert CatalogueModel.objects.get(name="identity").min_instances == 1
    call_command("catalogue_warm", "identity", "--min-instances", "0")
    assert CatalogueModel.objects.get(name="identity").min_instances == 0
    with pytest.raises(CommandError, match="no catalogue model named 'nope'"):
        call_command("catalogue_warm", "nope")


def test_warm_models_are_loaded_and_a_stale_row_is_not_taken_for_ready(local):
    server, client = local
    identity = CatalogueModel.objects.get(name="identity")
    # A READY row Triton does not back (a restarted server, before any reconcile noticed): not ready.
    Placement.objects.create(model=identity, server=server, gpus="0", instances=1, status=PlacementStatus.READY)
    assert "not loaded there" in models_not_ready(names=["identity"])["identity"]
    assert set(models_not_ready(names=WARM)) == set(WARM)

    call_command("catalogue_warm", *WARM, "--actor", "runner")
    call_command("fleet_wait_ready", *WARM, "--timeout", "60", "--actor", "runner")
    assert models_not_ready(names=WARM) == {}
    assert all(client.is_model_ready(name) for name in WARM)
    # Idle, but held at min_instances: planning again unloads nothing.
    assert fleet_wait_ready(names=WARM, timeout_s=5, actor="runner") < 5
    assert all(client.is_model_ready(name) for name in WARM)


def test_a_load_failure_ends_the_wait_at_once(local):
    CatalogueModel.objects.filter(name="scale2").update(triton_name="no_such_model")
    catalogue_set_min_instances(names=["scale2"], min_instances=1, actor="test")
    started = time.monotonic()
    with pytest.raises(ModelsNotReady, match="load failed: scale2 on local"):
        fleet_wait_ready(names=["scale2"], timeout_s=60, actor="test")
    assert time.monotonic() - started < 20


def test_a_timeout_says_which_model_waits_and_why(local):
    # No floor and no demand: the planner places nothing, so the wait ends at its timeout.
    with pytest.raises(ModelsNotReady, match=r"not ready after 0\.5s: identity: no ready placement"):
        fleet_wait_ready(names=["identity"], timeout_s=0.5, actor="test", poll_s=0.1)
    with pytest.raises(NotFound):
        models_not_ready(names=["nope"])
