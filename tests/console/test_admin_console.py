"""Roles, the audit log and the dashboards page in the admin, through Django's test client and real Postgres."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, User
from django.core.management import call_command
from django.utils import timezone

from controlplane.batches.models import Batch, BatchStatus
from controlplane.console.samples import samples_take
from controlplane.core.audit import AuditedAdmin
from controlplane.core.messaging import dispatch
from controlplane.core.models import AuditEntry
from controlplane.tenants.models import ApiKey, Tenant
from controlplane.usage.models import UsageRecord
from tests.support.scheduling import new_tenant, runnable_batch

pytestmark = pytest.mark.django_db

BATCHES = "/admin/batches/batch/"
DASHBOARD = "/admin/console/dashboard/"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Users' passwords are hashed with PBKDF2 otherwise: about a second per login.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


def staff(client, role: str):
    """A logged-in client of a staff user in the given role's group."""
    user = User.objects.create_user(username=f"{role}-user", password="pw", is_staff=True)
    user.groups.add(Group.objects.get(name=role))
    client.force_login(user)
    return client


def role_permissions() -> dict[str, set[str]]:
    return {
        g.name: {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.select_related("content_type")}
        for g in Group.objects.filter(name__in=("viewer", "operator", "admin"))
    }


def test_roles_give_what_operations_documents():
    perms = role_permissions()  # as `migrate` left them
    Group.objects.get(name="viewer").permissions.clear()
    call_command("roles_sync", verbosity=0)
    call_command("roles_sync", verbosity=0)  # idempotent
    assert role_permissions() == perms
    assert {"batches.view_batch", "console.view_dashboard", "core.view_auditentry"} <= perms["viewer"]
    assert all(p.split(".")[1].startswith("view_") for p in perms["viewer"])
    assert not any(p.startswith("auth.") for p in perms["viewer"])
    assert perms["operator"] == perms["viewer"] | {"core.run_admin_actions"}
    assert {"batches.change_batch", "auth.add_user", "core.run_admin_actions"} <= perms["admin"]


def test_every_registered_admin_is_audited():
    # A new ModelAdmin without the mixin would leave its actions out of the audit log: put AuditedAdmin first.
    missing = [type(ma).__name__ for ma in admin.site._registry.values() if not isinstance(ma, AuditedAdmin)]
    assert missing == []


def test_viewer_sees_no_action_and_cannot_run_one(client, catalogue):
    batch = runnable_batch(new_tenant("acme"), 3)
    viewer = staff(client, "viewer")
    page = viewer.get(BATCHES)
    assert page.status_code == 200 and "cancel_batches" not in page.content.decode()
    viewer.post(BATCHES, {"action": "cancel_batches", "_selected_action": [batch.id]})
    assert Batch.objects.get(id=batch.id).status == BatchStatus.IN_PROGRESS
    assert not AuditEntry.objects.exists()


def test_operator_runs_an_action_and_the_audit_log_has_it(client, catalogue):
    batch = runnable_batch(new_tenant("acme"), 3)
    operator = staff(client, "operator")
    assert "cancel_batches" in operator.get(BATCHES).content.decode()
    response = operator.post(BATCHES, {"action": "cancel_batches", "_selected_action": [batch.id]})
    assert response.status_code == 302
    assert Batch.objects.get(id=batch.id).status in (BatchStatus.CANCELLING, BatchStatus.CANCELLED)
    entry = AuditEntry.objects.get()
    assert (entry.actor, entry.action, entry.app_label, entry.model, entry.object_id) == (
        "operator-user",
        "cancel_batches",
        "batches",
        "batch",
        batch.id,
    )
    assert entry.details["selected"] == [batch.id] and entry.details["outcome"] == "done"
    # Operators edit no form.
    assert operator.get(f"{BATCHES}{quote(batch.id)}/change/").status_code == 200
    assert operator.post(f"/admin/tenants/tenant/{batch.tenant_id}/change/", {"name": "x"}).status_code == 403
    # The log is readable, and nobody can write to it from the admin.
    log = operator.get("/admin/core/auditentry/")
    assert log.status_code == 200 and "cancel_batches" in log.content.decode()
    assert operator.post("/admin/core/auditentry/add/", {}).status_code == 403


def test_queue_page_buttons_are_operator_actions_and_audited(client, catalogue):
    tenant = new_tenant("acme")
    operator = staff(client, "operator")
    operator.post("/admin/scheduling/slot/queue/", {"op": "tenant_paused", "tenant_id": tenant.id, "paused": "1"})
    assert Tenant.objects.get(id=tenant.id).paused
    entry = AuditEntry.objects.get()
    assert (entry.action, entry.model, entry.object_id, entry.details["changed"]) == (
        "queue_tenant_paused",
        "tenant",
        str(tenant.id),
        True,
    )


@pytest.mark.parametrize(("role", "buttons"), [("viewer", False), ("operator", True), ("admin", True)])
def test_queue_page_shows_its_buttons_only_to_roles_that_may_press_them(client, catalogue, role, buttons):
    page = staff(client, role).get("/admin/scheduling/slot/queue/")
    assert page.status_code == 200
    assert ('value="model_paused"' in page.content.decode()) is buttons


def test_change_and_delete_are_audited(admin_client):
    tenant = new_tenant("acme")
    key = ApiKey.objects.get(tenant=tenant)
    url = f"/admin/tenants/apikey/{key.id}/change/"
    response = admin_client.post(url, {"name": "renamed", "expires_at_0": "", "expires_at_1": ""})
    assert response.status_code == 302, response.content.decode()[-3000:]
    change = AuditEntry.objects.get(action="change")
    assert (change.actor, change.model, change.object_id) == ("admin", "apikey", str(key.id))
    assert change.details["changes"] == [{"changed": {"fields": ["Name"]}}]
    admin_client.post(f"/admin/tenants/tenant/{tenant.id}/delete/", {"post": "yes"})
    assert not Tenant.objects.filter(id=tenant.id).exists()
    deleted = AuditEntry.objects.get(action="delete")
    assert (deleted.model, deleted.object_id, deleted.object_repr) == ("tenant", str(tenant.id), "acme")


def test_dashboard_page_plots_samples_for_any_role(client, catalogue, settings):
    settings.SHARD_MAX_LINES = 4
    runnable_batch(new_tenant("acme"), 8)
    now = timezone.now()
    for minutes in (2, 1, 0):
        samples_take(now=now - timedelta(minutes=minutes))
    viewer = staff(client, "viewer")
    page = viewer.get(DASHBOARD).content.decode()
    assert "Queue depth" in page and 'data-series="identity"' in page
    assert page.count('class="cp-point"') >= 3 * 3  # three ticks on queue, throughput and utilisation at least
    assert 'class="selected">1h<' in page
    assert 'class="selected">7d<' in viewer.get(DASHBOARD + "?window=7d").content.decode()
    assert 'class="selected">1h<' in viewer.get(DASHBOARD + "?window=bogus").content.decode()
    assert client.get("/admin/").content.decode().count(DASHBOARD) >= 1  # linked from the index


def test_dashboard_is_staff_only(client):
    assert client.get(DASHBOARD).status_code == 302  # to the login page
    User.objects.create_user(username="tenant-person", password="pw")
    client.login(username="tenant-person", password="pw")
    assert client.get(DASHBOARD).status_code == 302


def test_cost_chart_stacks_tenants_per_day(admin_client, catalogue):
    now = timezone.now()
    for name, amount, days_ago in (("acme", "1.50", 0), ("beta", "0.50", 0), ("acme", "2.00", 1)):
        UsageRecord.objects.create(
            tenant=Tenant.objects.get_or_create(name=name)[0],
            batch_id="batch_x",
            shard_id=1,
            endpoint="/v2/infer",
            model="identity",
            triton_model="identity",
            finished_at=now - timedelta(days=days_ago),
            cost=Decimal(amount),
            currency="USD",
        )
    page = admin_client.get(DASHBOARD + "?window=7d").content.decode()
    assert "Cost per tenant per day (USD)" in page
    today, yesterday = now.date().isoformat(), (now - timedelta(days=1)).date().isoformat()
    assert f'data-series="acme" data-x="{today}" data-y="1.5"' in page
    assert f'data-series="beta" data-x="{today}" data-y="0.5"' in page
    assert f'data-series="acme" data-x="{yesterday}" data-y="2"' in page
