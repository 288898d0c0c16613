"""The operator side of the fleet in the admin: pages, actions, the overview, and `fleet_register`."""

from __future__ import annotations

import pytest
from django.contrib.messages import ERROR, get_messages
from django.core.management import CommandError, call_command

from controlplane.fleet.membership.inventory import server_register
from controlplane.fleet.models import CatalogueModel, Gpu, Placement, PlacementEvent, TritonServer
from controlplane.fleet.selectors import fleet_overview

pytestmark = pytest.mark.django_db

GIB = 1024**3
SERVERS = "/admin/fleet/tritonserver/"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # admin_client's superuser is hashed with PBKDF2 otherwise: about a second per test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def fleet(catalogue):
    """Two servers: a has minilm on gpu0 and a gang identity on gpus 0,1; b has a failed scale2 load."""
    a = server_register(name="triton-a", grpc_url="a:8001", gpu_memory_bytes=[16 * GIB, 16 * GIB])
    b = server_register(name="triton-b", grpc_url="b:8001", gpu_memory_bytes=[8 * GIB])
    Gpu.objects.filter(server=a, index=0).update(used_by_others_bytes=GIB)
    minilm = CatalogueModel.objects.get(triton_name="minilm")
    identity = CatalogueModel.objects.get(triton_name="identity")
    identity.gpus_per_instance = 2
    identity.save()
    Placement.objects.create(
        model=minilm, server=a, gpus="0", instances=2, status="ready", avg_queue_ms=1.5, avg_compute_ms=12.25
    )
    Placement.objects.create(model=identity, server=a, gpus="0,1", instances=1, status="ready")
    Placement.objects.create(
        model=CatalogueModel.objects.get(triton_name="scale2"),
        server=b,
        gpus="0",
        instances=0,
        status="failed",
        last_error="load failed: out of memory",
    )
    PlacementEvent.objects.create(
        model=minilm, server=a, gpus="0", action="load", before=0, after=2, reason="pending demand"
    )
    return a, b


def _messages(response) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


def test_fleet_pages_render(admin_client, fleet):
    a, _ = fleet
    placement = Placement.objects.get(gpus="0,1")
    event = PlacementEvent.objects.first()
    for path in (
        "tritonserver/",
        f"tritonserver/{a.id}/change/",
        "tritonserver/add/",
        "placement/",
        f"placement/{placement.id}/change/",
        "placementevent/",
        f"placementevent/{event.id}/change/",
        "cataloguemodel/",
        f"cataloguemodel/{placement.model_id}/change/",
        "placement/?status__exact=failed",
        "placementevent/?q=pending",
    ):
        assert admin_client.get(f"/admin/fleet/{path}").status_code == 200, path
    changelist = admin_client.get(SERVERS).content.decode()
    assert "/admin/fleet/tritonserver/overview/" in changelist
    assert "identity ×1 gpu[0,1]" in changelist and "scale2 ×0 gpu[0] (failed)" in changelist
    # Placements and their history are the reconciler's: no add page.
    assert admin_client.get("/admin/fleet/placement/add/").status_code == 403


def test_overview_shows_servers_gpus_and_gang_placements(admin_client, fleet):
    page = admin_client.get(f"{SERVERS}overview/")
    assert page.status_code == 200
    html = page.content.decode()
    for text in (
        "triton-a",
        "triton-b",
        "gang 0,1",
        "queue 1.5 ms",
        "compute 12.3 ms",
        "load failed: out of memory",
        "pending demand",
        "16.0\xa0GB",
    ):
        assert text in html, text

    overview = fleet_overview()
    a, b = overview.servers
    gpu0, gpu1 = a.gpus
    # gpu0: 1 GiB others + 2 × 512 MiB minilm + 1 × 64 MiB identity (the gang counts on each of its GPUs).
    assert gpu0.used_bytes == GIB + 2 * 512 * 1024**2 + 64 * 1024**2
    assert [(s.model, s.instances) for s in gpu0.shares] == [("identity", 1), ("minilm", 2)]
    assert [s.model for s in gpu1.shares] == ["identity"] and gpu1.placed_bytes == 64 * 1024**2
    assert gpu0.others_percent == 6 and gpu0.placed_percent == 7 and not gpu0.overcommitted
    assert a.instances == 3
    failed = b.gpus[0].shares[0]
    assert failed.status == "failed" and failed.memory_bytes == 0
    assert [e.action for e in overview.events] == ["load"]


def test_overview_flags_overcommitted_gpus_and_stray_placements(fleet):
    a, _ = fleet
    Gpu.objects.filter(server=a, index=1).update(used_by_others_bytes=16 * GIB)
    Placement.objects.create(model=CatalogueModel.objects.get(triton_name="scale2"), server=a, gpus="3", instances=1)
    server = fleet_overview().servers[0]
    assert server.gpus[1].overcommitted and server.gpus[1].others_percent + server.gpus[1].placed_percent == 100
    assert [(s.model, s.gpus) for s in server.stray] == [("scale2", "3")]


def test_empty_overview_renders(admin_client, db):
    assert b"No Triton servers registered" in admin_client.get(f"{SERVERS}overview/").content


@pytest.mark.parametrize(
    ("action", "state", "operator_state", "event"),
    [
        ("drain", "draining", "draining", "server_draining"),
        ("cordon", "cordoned", "cordoned", "server_cordoned"),
        ("return_to_normal", "healthy", None, "server_uncordon"),
    ],
)
def test_operator_actions_set_state_and_record_an_event(admin_client, fleet, action, state, operator_state, event):
    a, b = fleet
    TritonServer.objects.filter(id=b.id).update(operator_state="cordoned", state="cordoned")
    response = admin_client.post(SERVERS, {"action": action, "_selected_action": [a.id, b.id]})
    assert response.status_code == 302
    for server in TritonServer.objects.all():
        assert (server.state, server.operator_state) == (state, operator_state)
    events = PlacementEvent.objects.filter(action=event)
    assert sorted(e.server.name for e in events) == ["triton-a", "triton-b"]
    assert {e.actor for e in events} == {"admin"}


def test_rebalance_now_enqueues_a_reconcile(admin_client, fleet, monkeypatch):
    from controlplane.core.messaging import dispatch

    calls = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: calls.append((task_name, args)))
    response = admin_client.post(SERVERS, {"action": "rebalance_now", "_selected_action": [fleet[0].id]})
    assert response.status_code == 302
    assert calls == [("fleet.reconcile", ["admin:admin"])]
    assert "Rebalance enqueued" in _messages(response)[0][1]


def test_rebalance_now_reports_a_broker_error(admin_client, fleet, monkeypatch):
    from kombu.exceptions import OperationalError

    from controlplane.core.messaging import dispatch

    def down(task_name, args):
        raise OperationalError("[Errno 111] Connection refused")

    monkeypatch.setattr(dispatch, "send", down)
    response = admin_client.post(SERVERS, {"action": "rebalance_now", "_selected_action": [fleet[0].id]}, follow=True)
    assert response.status_code == 200
    [(level, message)] = [(m.level, m.message) for m in response.context["messages"]]
    assert level == ERROR and "Connection refused" in message


def _catalogue_post(model: CatalogueModel, **changes) -> dict:
    data = {
        "name": model.name,
        "triton_name": model.triton_name,
        "kind": model.kind,
        "max_batch_size": model.max_batch_size,
        "embedding_dimensions": model.embedding_dimensions or "",
        "is_enabled": "on",
        "inputs": '[{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}]',
        "outputs": "",
        "min_instances": 0,
        "max_instances": 4,
        "pin_server": "",
        "pin_gpus": "[]",
        "memory_per_instance_bytes": model.memory_per_instance_bytes,
        "load_seconds": 2.0,
        "gpus_per_instance": 1,
        "pool": model.pool,
        "context_length": model.context_length or "",
        "tokenizer_dir": model.tokenizer_dir,
        "max_num_seqs": model.max_num_seqs or "",
        "completion_weight": model.completion_weight,
    }
    return {**data, **changes}


@pytest.mark.parametrize(
    ("pin_gpus", "extra", "error"),
    [
        ('["a"]', {}, "list of GPU indices"),
        ('{"gpu": 0}', {}, "list of GPU indices"),
        ("[0, 0]", {}, "distinct"),
        ("[true]", {}, "list of GPU indices"),
        ("not json", {}, "valid JSON"),
        ("[0]", {"gpus_per_instance": 2}, "pins fewer GPUs than one instance needs"),
        ("[]", {"min_instances": 5, "max_instances": 2}, "min_instances"),
    ],
)
def test_bad_placement_profile_is_a_form_error(admin_client, catalogue, pin_gpus, extra, error):
    model = CatalogueModel.objects.get(triton_name="identity")
    response = admin_client.post(
        f"/admin/fleet/cataloguemodel/{model.id}/change/", _catalogue_post(model, pin_gpus=pin_gpus, **extra)
    )
    assert response.status_code == 200  # the form again, with the error
    assert error in response.content.decode()
    model.refresh_from_db()
    assert model.pin_gpus == [] and model.gpus_per_instance == 1


def test_placement_profile_saves_pins(admin_client, fleet):
    model = CatalogueModel.objects.get(triton_name="identity")
    response = admin_client.post(
        f"/admin/fleet/cataloguemodel/{model.id}/change/",
        _catalogue_post(model, pin_server=fleet[0].id, pin_gpus="[1, 0]", gpus_per_instance=2),
    )
    assert response.status_code == 302
    model.refresh_from_db()
    assert (model.pin_server_id, model.pin_gpus, model.outputs) == (fleet[0].id, [0, 1], [])


def test_a_generation_model_shows_and_saves_its_generation_profile(admin_client, catalogue):
    model = CatalogueModel.objects.get(triton_name="tinylm")
    page = admin_client.get(f"/admin/fleet/cataloguemodel/{model.id}/change/").content.decode()
    for field in ("context_length", "tokenizer_dir", "max_num_seqs", "completion_weight", "expected_completion_tokens"):
        assert f"field-{field}" in page, field
    assert 'name="expected_completion_tokens"' not in page  # measured, shown read-only
    response = admin_client.post(
        f"/admin/fleet/cataloguemodel/{model.id}/change/",
        _catalogue_post(model, inputs="", completion_weight="2.5", max_num_seqs=32, pool="cpu"),
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    model.refresh_from_db()
    assert (model.completion_weight, model.max_num_seqs, model.pool) == (2.5, 32, "cpu")


def test_declared_gpus_are_editable_inline(admin_client, fleet):
    a, _ = fleet
    gpus = list(a.gpus.order_by("index"))
    data = {
        "name": a.name,
        "grpc_url": a.grpc_url,
        "metrics_url": "",
        "pool": "default",
        "gpus-TOTAL_FORMS": 2,
        "gpus-INITIAL_FORMS": 2,
        "gpus-MIN_NUM_FORMS": 0,
        "gpus-MAX_NUM_FORMS": 1000,
    }
    for i, gpu in enumerate(gpus):
        data.update(
            {
                f"gpus-{i}-id": gpu.id,
                f"gpus-{i}-server": a.id,
                f"gpus-{i}-index": gpu.index,
                f"gpus-{i}-name": "declared",
                f"gpus-{i}-total_memory_bytes": 24 * GIB,
                f"gpus-{i}-used_by_others_bytes": 0,
            }
        )
    response = admin_client.post(f"{SERVERS}{a.id}/change/", data)
    assert response.status_code == 302, response.content.decode()[:2000]
    assert set(a.gpus.values_list("total_memory_bytes", flat=True)) == {24 * GIB}


def test_measured_gpus_are_read_only(admin_client, fleet):
    a, _ = fleet
    Gpu.objects.filter(server=a).update(declared=False)
    page = admin_client.get(f"{SERVERS}{a.id}/change/").content.decode()
    assert 'name="gpus-0-total_memory_bytes"' not in page


def test_fleet_register_creates_a_server_with_gpus(db):
    call_command(
        "fleet_register",
        "triton-x",
        "x:8001",
        "--gpu-memory",
        "16G,512M,1024",
        "--metrics-url",
        "http://x:8002/metrics",
        "--real-gpus",
    )
    server = TritonServer.objects.get(name="triton-x")
    assert (server.grpc_url, server.metrics_url, server.real_gpus) == ("x:8001", "http://x:8002/metrics", True)
    assert list(server.gpus.values_list("index", "total_memory_bytes")) == [
        (0, 16 * GIB),
        (1, 512 * 1024**2),
        (2, 1024),
    ]
    call_command("fleet_register", "triton-x", "x:8001", "--gpu-memory", "24GiB")  # update: one GPU left
    assert list(server.gpus.values_list("total_memory_bytes", flat=True)) == [24 * GIB]


@pytest.mark.parametrize("sizes", ["12X", "", "16G,,16G", "0", "1.5.G"])
def test_fleet_register_rejects_bad_sizes(db, sizes):
    with pytest.raises(CommandError, match="--gpu-memory"):
        call_command("fleet_register", "triton-x", "x:8001", "--gpu-memory", sizes)
    assert not TritonServer.objects.exists()


def test_fleet_register_rejects_a_grpc_url_taken_by_another_server(db):
    call_command("fleet_register", "triton-x", "x:8001", "--gpu-memory", "16G")
    with pytest.raises(CommandError, match="already registered"):
        call_command("fleet_register", "triton-y", "x:8001", "--gpu-memory", "16G")


def test_overview_shows_consolidation_moves_and_the_model_they_make_room_for(admin_client, fleet):
    a, _b = fleet
    scale2 = CatalogueModel.objects.get(triton_name="scale2")
    minilm = CatalogueModel.objects.get(triton_name="minilm")
    PlacementEvent.objects.create(
        model=scale2, gpus="1", action="consolidate", reason="planned 1 move(s)", move_for="scale2"
    )
    PlacementEvent.objects.create(
        model=minilm, server=a, gpus="1", action="move_in", before=0, after=1, reason="moved", move_for="scale2"
    )
    overview = fleet_overview()
    assert [(e.action, e.model, e.move_for) for e in overview.moves] == [
        ("move_in", "minilm", "scale2"),
        ("consolidate", "scale2", "scale2"),
    ]
    assert [e.action for e in overview.events][:2] == ["move_in", "consolidate"]
    html = admin_client.get(f"{SERVERS}overview/").content.decode()
    section = html[html.index("Consolidation moves") : html.index("Latest placement events")]
    assert "move_in" in section and "<strong>scale2</strong>" in section and "planned 1 move(s)" in section
