"""Tenant quotas and scheduling in the admin: fieldsets, list editing, pause/resume through the service."""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages
from django.core.exceptions import ValidationError

from controlplane.tenants.models import Tenant, TenantEvent
from controlplane.tenants.services import tenant_set_paused

pytestmark = pytest.mark.django_db

TENANTS = "/admin/tenants/tenant/"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # admin_client's superuser is hashed with PBKDF2 otherwise: about a second per test.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_change_page_shows_quotas_and_scheduling(admin_client, tenant):
    page = admin_client.get(f"{TENANTS}{tenant.id}/change/").content.decode()
    for field in (
        "max_concurrent_batches",
        "max_enqueued_lines",
        "max_enqueued_tokens",
        "max_requests_per_minute",
        "weight",
        "max_priority",
        "default_priority",
    ):
        assert f'name="{field}"' in page, field
    assert 'name="paused"' not in page  # read-only: changed by the actions only
    assert "Quotas" in page and "Scheduling" in page


def test_pause_and_resume_actions_go_through_the_service(admin_client, tenant, other_tenant):
    response = admin_client.post(TENANTS, {"action": "pause", "_selected_action": [tenant.id, other_tenant.id]})
    assert response.status_code == 302
    assert set(Tenant.objects.filter(paused=True).values_list("name", flat=True)) == {"tenant-a", "tenant-b"}
    assert [m.message for m in get_messages(response.wsgi_request)] == ["Paused: tenant-a, tenant-b."]
    event = TenantEvent.objects.get(tenant=tenant)
    assert (event.kind, event.actor) == ("paused", "admin")
    # Pausing again changes nothing and records nothing.
    admin_client.post(TENANTS, {"action": "pause", "_selected_action": [tenant.id]})
    assert TenantEvent.objects.filter(tenant=tenant).count() == 1
    admin_client.post(TENANTS, {"action": "resume", "_selected_action": [tenant.id]})
    assert not Tenant.objects.get(id=tenant.id).paused and Tenant.objects.get(id=other_tenant.id).paused
    assert list(TenantEvent.objects.filter(tenant=tenant).values_list("kind", flat=True)) == ["resumed", "paused"]
    assert "resumed" in admin_client.get(f"{TENANTS}{tenant.id}/change/").content.decode()


def test_weight_and_priorities_are_edited_on_the_list(admin_client, tenant):
    form = {
        "form-TOTAL_FORMS": "1",
        "form-INITIAL_FORMS": "1",
        "form-0-id": str(tenant.id),
        "form-0-weight": "2.5",
        "form-0-max_priority": "high",
        "form-0-default_priority": "normal",
        "_save": "Save",
    }
    assert admin_client.post(TENANTS, form).status_code == 302
    tenant.refresh_from_db()
    assert (tenant.weight, tenant.max_priority, tenant.default_priority) == (2.5, "high", "normal")
    # A default above the maximum is refused with the field named, and nothing is saved.
    form.update({"form-0-max_priority": "low", "form-0-default_priority": "high"})
    response = admin_client.post(TENANTS, form)
    assert response.status_code == 200 and "cannot be above the maximum" in response.content.decode()
    assert Tenant.objects.get(id=tenant.id).max_priority == "high"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"weight": 0.0}, "weight"),
        ({"weight": -1.0}, "weight"),
        ({"max_priority": "normal", "default_priority": "high"}, "default_priority"),
    ],
)
def test_tenant_settings_that_make_no_sense_are_refused(tenant, changes, field):
    for name, value in changes.items():
        setattr(tenant, name, value)
    with pytest.raises(ValidationError) as raised:
        tenant.full_clean()
    assert field in raised.value.message_dict


def test_tenant_set_paused_reports_whether_it_changed(tenant):
    assert tenant_set_paused(tenant_id=tenant.id, paused=True, actor="ops") is True
    assert tenant_set_paused(tenant_id=tenant.id, paused=True, actor="ops") is False
    assert tenant_set_paused(tenant_id=tenant.id, paused=False, actor="ops") is True
    assert list(TenantEvent.objects.values_list("kind", "actor")) == [("resumed", "ops"), ("paused", "ops")]
