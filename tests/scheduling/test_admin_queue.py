"""The queue page in the admin and the operator actions that steer it: priority, tenant and model pauses."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest
from django.contrib.messages import ERROR, get_messages
from django.utils import timezone

from controlplane.batches.models import Batch, BatchEvent, Shard, ShardStatus
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel, PlacementEvent
from controlplane.scheduling.models import SchedulerClock, Slot, SlotState, TenantShare
from controlplane.scheduling.queue_overview import queue_overview
from controlplane.tenants.models import Tenant, TenantEvent
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db

QUEUE = "/admin/scheduling/slot/queue/"
TOPUP = "scheduling.slots_topup"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # admin_client's superuser is hashed with PBKDF2 otherwise: about a second per test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def sent(monkeypatch):
    """What the services put on the broker (after commit); nothing really goes out."""
    messages: list[tuple[str, list]] = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: messages.append((task_name, args)))
    return messages


@pytest.fixture
def queue(settings, catalogue, sent):
    """Two tenants with runnable identity work, and a paused third one.

    alpha (weight 3): batch a, normal, 3 shards of 2 rows; shard 0 running (claimed 60 s ago), last
      dispatched 120 s ago, expiring in 30 s: 6 work units left at 0.3 units/s need 20 s > half of 30 s.
    beta (weight 1): batch b, high, 3 shards; shard 0 succeeded (claimed 300 s ago), last dispatched 30 s ago.
    gamma (paused): batch g, normal, 1 shard: held.
    identity: call cap 9 → 3 slots of 3 calls; 10 s per work unit per slot → 0.3 units/s; 1 queued and 1
    running slot (and an expired one, which does not count). Virtual times: alpha 4, beta 6, V = 5."""
    settings.SHARD_MAX_LINES = 2
    settings.DISPATCH_INFLIGHT_CALLS = 3
    settings.SCHEDULER_POLICY = "fair"
    settings.SCHEDULER_AGING_SECONDS = 3600.0
    settings.SCHEDULER_HALF_LIFE_SECONDS = math.inf  # no decay: virtual times read exactly
    settings.SCHEDULER_DEADLINE_FRACTION = 0.5
    alpha = new_tenant("alpha", weight=3.0)
    beta = new_tenant("beta", weight=1.0, max_priority="high")
    gamma = new_tenant("gamma")
    a = runnable_batch(alpha, 6, prefix="a")
    b = runnable_batch(beta, 6, prefix="b", priority="high")
    g = runnable_batch(gamma, 2, prefix="g")
    Tenant.objects.filter(id=gamma.id).update(paused=True)
    assert [Shard.objects.filter(batch=x).count() for x in (a, b, g)] == [3, 3, 1]
    assert Batch.objects.get(id=a.id).work_units == 6  # one work unit per tensor row

    now = timezone.now()
    identity = CatalogueModel.objects.get(name="identity")
    CatalogueModel.objects.filter(id=identity.id).update(max_inflight_calls=9, seconds_per_work_unit=10.0)
    Shard.objects.filter(batch=a, index=0).update(
        status=ShardStatus.RUNNING, attempt=1, started_at=now - timedelta(seconds=60)
    )
    Shard.objects.filter(batch=b, index=0).update(
        status=ShardStatus.SUCCEEDED, attempt=1, started_at=now - timedelta(seconds=300), finished_at=now
    )
    Batch.objects.filter(id=a.id).update(
        last_dispatched_at=now - timedelta(seconds=120), expires_at=now + timedelta(seconds=30)
    )
    Batch.objects.filter(id=b.id).update(last_dispatched_at=now - timedelta(seconds=30))
    TenantShare.objects.create(tenant=alpha, vtime=4.0, vtime_at=now, served_work_units=12.0)
    TenantShare.objects.create(tenant=beta, vtime=6.0, vtime_at=now, served_work_units=2.0)
    SchedulerClock.objects.create(name="default", vtime=5.0, vtime_at=now)
    later = now + timedelta(seconds=60)
    Slot.objects.create(model=identity, state=SlotState.QUEUED, expires_at=later)
    Slot.objects.create(model=identity, state=SlotState.RUNNING, owner="w1", expires_at=later)
    Slot.objects.create(model=identity, state=SlotState.QUEUED, expires_at=now - timedelta(seconds=1))
    sent.clear()
    return {"now": now, "alpha": alpha, "beta": beta, "gamma": gamma, "a": a, "b": b, "g": g, "identity": identity}


def _row(html: str, row_id: str) -> list[str]:
    """The text of each cell of the table row with this id, tags stripped and whitespace collapsed."""
    match = re.search(rf'<tr id="{re.escape(row_id)}">(.*?)</tr>', html, re.S)
    assert match, row_id
    cells = re.findall(r"<td[^>]*>(.*?)</td>", match.group(1), re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in cells]


def _messages(response) -> list[tuple[int, str]]:
    return [(m.level, m.message) for m in get_messages(response.wsgi_request)]


def test_queue_overview_numbers(queue):
    now = queue["now"]
    overview = queue_overview(now=now)
    [identity] = [m for m in overview.models if m.name == "identity"]
    assert (identity.call_cap, identity.slot_cap, identity.queued_slots, identity.running_slots) == (9, 3, 1, 1)
    assert identity.throughput == pytest.approx(0.3)
    high, normal, low = identity.classes
    assert (high.priority, high.runnable_shards, high.runnable_lines, high.runnable_work) == ("high", 2, 4, 4)
    assert (high.held_shards, high.running_shards, high.oldest_wait_seconds) == (0, 0, 30.0)
    assert (normal.runnable_shards, normal.runnable_lines, normal.runnable_work) == (2, 4, 4)
    # gamma's shard is held (its tenant is paused); alpha's shard 0 runs.
    assert (normal.held_shards, normal.running_shards, normal.oldest_wait_seconds) == (1, 1, 120.0)
    assert (low.runnable_shards, low.held_shards, low.oldest_wait_seconds) == (0, 0, None)

    # a's deadline is at risk, so it is served before b's high class.
    first, second = identity.serving
    assert (first.batch_id, first.tier, first.position, second.batch_id, second.tier) == (
        queue["a"].id,
        "urgent",
        1,
        queue["b"].id,
        "high",
    )
    [risk] = overview.at_risk
    assert (risk.batch_id, risk.position, risk.runnable_batches, risk.remaining_work) == (queue["a"].id, 1, 2, 6)
    assert risk.needed_seconds == pytest.approx(20.0)
    assert risk.seconds_left == pytest.approx(30.0)
    assert risk.slack_seconds == pytest.approx(10.0)

    alpha, beta, gamma = overview.tenants
    assert (alpha.name, alpha.weight_share, alpha.recent_work, alpha.served_share) == ("alpha", 0.75, 2, 0.5)
    assert (alpha.effective_vtime, alpha.served_total) == (5.0, 12.0)  # 4 is behind V = 5: it starts at V
    assert (alpha.runnable_shards, alpha.runnable_work, alpha.held_shards, alpha.running_shards) == (2, 4, 0, 1)
    assert (beta.weight_share, beta.recent_work, beta.served_share, beta.effective_vtime) == (0.25, 2, 0.5, 6.0)
    assert (gamma.paused, gamma.weight_share, gamma.served_share, gamma.held_shards) == (True, None, 0.0, 1)
    assert overview.system_vtime == 5.0 and overview.recent_window_minutes == 15


def test_queue_page_shows_the_queue(admin_client, queue):
    index = admin_client.get("/admin/").content.decode()
    assert "/admin/scheduling/slot/" in index
    assert QUEUE in admin_client.get("/admin/scheduling/slot/").content.decode()
    assert QUEUE in admin_client.get("/admin/scheduling/tenantshare/").content.decode()

    before = timezone.now()
    response = admin_client.get(QUEUE)
    after = timezone.now()
    assert response.status_code == 200
    html = response.content.decode()
    text = " ".join(html.split())
    assert "slots: 1 queued + 1 running of 3 (call cap 9)" in text
    assert "throughput: 0.3 work units/s" in text
    assert "claimed in the last 15 minutes" in text
    high = _row(html, "queue-identity-high")
    assert high[:6] == ["high", "2", "4", "4", "0", "0"] and re.fullmatch(r"3\d s", high[6])
    normal = _row(html, "queue-identity-normal")
    assert normal[:6] == ["normal", "2", "4", "4", "1", "1"] and re.fullmatch(r"12\d s", normal[6])
    assert _row(html, "queue-identity-low") == ["low", "0", "0", "0", "0", "0", "—"]
    # tenant, weight, weight share, served share, served 15 min, served total, vtime, runnable, work, held, running
    assert _row(html, f"queue-tenant-{queue['alpha'].id}")[:11] == [
        "alpha",
        "3",
        "75%",
        "50%",
        "2",
        "12",
        "5.00",
        "2",
        "4",
        "0",
        "1",
    ]
    assert _row(html, f"queue-tenant-{queue['beta'].id}")[:11] == [
        "beta",
        "1",
        "25%",
        "50%",
        "2",
        "2",
        "6.00",
        "2",
        "4",
        "0",
        "0",
    ]
    assert _row(html, f"queue-tenant-{queue['gamma'].id}")[:11] == [
        "gamma paused",
        "1",
        "—",
        "0%",
        "0",
        "0",
        "5.00",
        "0",
        "0",
        "1",
        "0",
    ]
    risk = _row(html, f"queue-risk-{queue['a'].id}")
    assert risk[:6] == [queue["a"].id, "alpha", "identity", "normal", "1 of 2", "6"]
    assert risk[6] == "20 s"
    # The time left is read when the page renders: between the window's end less `after` and less `before` (the
    # fixture set it 30 s ahead, but a loaded host can take seconds to get here: 28 s was seen).
    expires_at = Batch.objects.get(id=queue["a"].id).expires_at
    left = re.fullmatch(r"(\d+) s", risk[7])
    assert left, risk[7]
    lowest, highest = (expires_at - after).total_seconds(), (expires_at - before).total_seconds()
    assert math.floor(lowest) <= int(left.group(1)) <= math.ceil(highest), (risk[7], lowest, highest)


def test_empty_queue_page_renders(admin_client, catalogue):
    html = admin_client.get(QUEUE).content.decode()
    assert "No tenant has queued or running work." in html and "No batch is at deadline risk." in html


def test_batch_priority_action_on_the_changelist(admin_client, queue, sent, django_capture_on_commit_callbacks):
    b = queue["b"]
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/admin/batches/batch/", {"action": "set_priority_low", "_selected_action": [b.id]}
        )
    assert response.status_code == 302
    assert Batch.objects.get(id=b.id).priority == "low"
    event = BatchEvent.objects.filter(batch=b, kind="priority_changed").get()
    assert event.message == "high → low by admin"
    assert sent == [(TOPUP, ["identity"])]
    assert _messages(response)[-1][1] == "1 batch(es) moved to priority low."


def test_batch_priority_form_on_the_queue_page_may_exceed_the_tenants_maximum(
    admin_client, queue, sent, django_capture_on_commit_callbacks
):
    a = queue["a"]
    assert queue["alpha"].max_priority == "normal"  # the API would refuse "high" for alpha
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(QUEUE, {"op": "batch_priority", "batch_id": a.id, "priority": "high"})
    assert response.status_code == 302 and response["Location"] == QUEUE
    assert Batch.objects.get(id=a.id).priority == "high"
    assert BatchEvent.objects.get(batch=a, kind="priority_changed").message == "normal → high by admin"
    assert sent == [(TOPUP, ["identity"])]
    [identity] = [m for m in queue_overview(now=timezone.now()).models if m.name == "identity"]
    assert [c.runnable_shards for c in identity.classes] == [4, 0, 0]


def test_priority_of_a_finished_batch_is_refused(admin_client, queue, sent, django_capture_on_commit_callbacks):
    b = queue["b"]
    Batch.objects.filter(id=b.id).update(status="completed")
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(QUEUE, {"op": "batch_priority", "batch_id": b.id, "priority": "low"})
    assert response.status_code == 302
    [(level, message)] = _messages(response)
    assert level == ERROR and "completed" in message
    assert Batch.objects.get(id=b.id).priority == "high"
    assert not BatchEvent.objects.filter(kind="priority_changed").exists() and sent == []


def test_incomplete_action_is_reported(admin_client, queue, sent):
    response = admin_client.post(QUEUE, {"op": "tenant_paused", "tenant_id": queue["alpha"].id})
    [(level, message)] = _messages(response)
    assert level == ERROR and "tenant_paused needs paused" in message
    assert not Tenant.objects.get(id=queue["alpha"].id).paused


def test_tenant_pause_and_resume_on_the_queue_page(admin_client, queue, sent, django_capture_on_commit_callbacks):
    alpha, gamma = queue["alpha"], queue["gamma"]
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(QUEUE, {"op": "tenant_paused", "tenant_id": alpha.id, "paused": "1"})
        admin_client.post(QUEUE, {"op": "tenant_paused", "tenant_id": gamma.id, "paused": "0"})
    assert (Tenant.objects.get(id=alpha.id).paused, Tenant.objects.get(id=gamma.id).paused) == (True, False)
    assert [(e.tenant_id, e.kind, e.actor) for e in TenantEvent.objects.order_by("id")] == [
        (alpha.id, "paused", "admin"),
        (gamma.id, "resumed", "admin"),
    ]
    assert sent == [(TOPUP, [None])]  # the resume tops up; a pause needs none (claims skip paused tenants)
    tenants = {t.name: t for t in queue_overview(now=timezone.now()).tenants}
    assert (tenants["alpha"].runnable_shards, tenants["alpha"].held_shards) == (0, 2)
    assert (tenants["gamma"].runnable_shards, tenants["gamma"].held_shards) == (1, 0)

    # Again: nothing changes, so no event and no top-up.
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(QUEUE, {"op": "tenant_paused", "tenant_id": alpha.id, "paused": "1"})
    assert "it already was" in _messages(response)[-1][1]
    assert TenantEvent.objects.count() == 2 and sent == []


def test_model_pause_on_the_queue_page_and_resume_in_the_catalogue(
    admin_client, queue, sent, django_capture_on_commit_callbacks
):
    identity = queue["identity"]
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(QUEUE, {"op": "model_paused", "model_id": identity.id, "paused": "1"})
    assert CatalogueModel.objects.get(id=identity.id).paused
    assert sent == [(TOPUP, ["identity"])]
    [model] = [m for m in queue_overview(now=timezone.now()).models if m.name == "identity"]
    assert [(c.runnable_shards, c.held_shards) for c in model.classes] == [(0, 2), (0, 3), (0, 0)]
    assert model.serving == []

    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            "/admin/fleet/cataloguemodel/", {"action": "resume_dispatch", "_selected_action": [identity.id]}
        )
    assert response.status_code == 302
    assert not CatalogueModel.objects.get(id=identity.id).paused
    assert sent == [(TOPUP, ["identity"])]
    assert [(e.action, e.actor, e.model_id) for e in PlacementEvent.objects.order_by("id")] == [
        ("model_paused", "admin", identity.id),
        ("model_resumed", "admin", identity.id),
    ]
    assert _messages(response)[-1][1] == "Resumed: identity."


def test_catalogue_pause_action(admin_client, queue, sent, django_capture_on_commit_callbacks):
    identity = queue["identity"]
    with django_capture_on_commit_callbacks(execute=True):
        admin_client.post(
            "/admin/fleet/cataloguemodel/", {"action": "pause_dispatch", "_selected_action": [identity.id]}
        )
    assert CatalogueModel.objects.get(id=identity.id).paused
    assert PlacementEvent.objects.get().action == "model_paused"
    assert sent == [(TOPUP, ["identity"])]
    assert "paused" in admin_client.get("/admin/fleet/cataloguemodel/?paused__exact=1").content.decode()
