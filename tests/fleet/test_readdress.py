"""A live server is not moved to other addresses by a registration made by mistake (fleet/membership/join_leave.py,
``readdress_check``): refused with 409 unless an operator forces it, through ``fleet_register`` and the
internal API; a server whose heartbeat went stale, or whose old address no longer answers, moves at once."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.fleet.models import PlacementEvent, TritonServer
from controlplane.triton.client import TritonClient

pytestmark = pytest.mark.django_db
TOKEN = "fleet-token-for-tests"
OLD = {"name": "triton-0", "grpc_url": "10.0.0.7:8001", "http_url": "http://10.0.0.7:8000", "gpu_memory_gib": [16]}
NEW = OLD | {"grpc_url": "10.0.0.9:8001", "http_url": "http://10.0.0.9:8000"}


@pytest.fixture
def fleet_api(settings):
    settings.FLEET_SCALING = replace(settings.FLEET_SCALING, token=TOKEN)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    return client


@pytest.fixture
def old_answers(monkeypatch):
    """The old address's answer to the liveness probe; records which addresses were probed."""
    state = {"live": True, "probed": []}

    def is_live(client):
        state["probed"].append(client.url)
        return state["live"]

    monkeypatch.setattr(TritonClient, "is_live", is_live)
    return state


@pytest.fixture
def live_row(fleet_api):
    assert fleet_api.post("/internal/fleet/servers", OLD, format="json").status_code == 201
    TritonServer.objects.filter(name="triton-0").update(last_heartbeat_at=timezone.now(), missed_heartbeats=0)
    return TritonServer.objects.get(name="triton-0")


def _addresses() -> tuple[str, str]:
    server = TritonServer.objects.get(name="triton-0")
    return server.grpc_url, server.http_url


def test_the_api_refuses_to_move_a_live_server_unless_forced(fleet_api, live_row, old_answers):
    refused = fleet_api.post("/internal/fleet/servers", NEW, format="json")
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "server_live" and "10.0.0.7:8001" in error["message"] and "force" in error["message"]
    assert old_answers["probed"] == ["10.0.0.7:8001"]
    assert _addresses() == (OLD["grpc_url"], OLD["http_url"])
    # The same addresses again are no move: still idempotent, no probe.
    assert fleet_api.post("/internal/fleet/servers", OLD, format="json").status_code == 200
    assert len(old_answers["probed"]) == 1

    forced = fleet_api.post("/internal/fleet/servers", NEW | {"force": True}, format="json")
    assert forced.status_code == 200, forced.content
    assert _addresses() == (NEW["grpc_url"], NEW["http_url"])
    event = PlacementEvent.objects.get(action="server_readdress")
    assert event.actor == "fleet_api" and "(forced)" in event.reason and "10.0.0.9:8001" in event.reason


def test_the_command_refuses_to_move_a_live_server_unless_forced(live_row, old_answers):
    args = [
        "--name",
        "triton-0",
        "--grpc-url",
        NEW["grpc_url"],
        "--http-url",
        NEW["http_url"],
        "--gpu-memory-gib",
        "16",
    ]
    with pytest.raises(CommandError, match=r"is live at 10\.0\.0\.7:8001"):
        call_command("fleet_register", *args)
    assert _addresses() == (OLD["grpc_url"], OLD["http_url"])
    call_command("fleet_register", *args, "--force")
    assert _addresses() == (NEW["grpc_url"], NEW["http_url"])


def test_a_changed_http_url_alone_is_a_move_too(fleet_api, live_row, old_answers):
    response = fleet_api.post("/internal/fleet/servers", OLD | {"http_url": "http://10.0.0.9:8000"}, format="json")
    assert response.status_code == 409


@pytest.mark.parametrize(
    "how",
    ["old_address_gone", "heartbeat_stale", "never_heartbeat", "unhealthy"],
)
def test_a_server_that_is_not_live_moves_without_force(fleet_api, live_row, old_answers, settings, how):
    """The ordinary replacement (a restarted pod or host on a new address) must not need an operator."""
    if how == "old_address_gone":
        old_answers["live"] = False
    elif how == "heartbeat_stale":
        stale = timezone.now() - timedelta(seconds=4 * settings.FLEET_HEARTBEAT_INTERVAL_SECONDS)
        TritonServer.objects.filter(id=live_row.id).update(last_heartbeat_at=stale)
    elif how == "never_heartbeat":
        TritonServer.objects.filter(id=live_row.id).update(last_heartbeat_at=None)
    else:
        TritonServer.objects.filter(id=live_row.id).update(state="unhealthy", missed_heartbeats=2)
    response = fleet_api.post("/internal/fleet/servers", NEW, format="json")
    assert response.status_code == 200, response.content
    assert _addresses() == (NEW["grpc_url"], NEW["http_url"])
    assert "(forced)" not in PlacementEvent.objects.get(action="server_readdress").reason
