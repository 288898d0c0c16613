"""API keys expire and can be revoked for good: service, authentication, admin action, commands."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.core.http.errors import NotFound, ValidationFailed
from controlplane.tenants.models import ApiKey, Tenant, TenantEvent
from controlplane.tenants.services import api_key_create, api_key_revoke

pytestmark = pytest.mark.django_db

KEYS = "/admin/tenants/apikey/"


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _client(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def _error(response) -> dict:
    assert response.status_code == 401, response.content
    return response.json()["error"]


def test_a_key_without_expiry_works_until_revoked(tenant):
    key = ApiKey.objects.get(tenant=tenant)
    assert key.expires_at is None
    client = _client(tenant.raw_key)
    assert client.get("/v1/files").status_code == 200
    assert api_key_revoke(key_id=key.id, actor="ops") is True
    error = _error(client.get("/v1/files"))
    assert error["type"] == "authentication_error"
    assert "was revoked at" in error["message"] and key.prefix in error["message"]


def test_an_expired_key_is_refused_with_the_reason(tenant):
    key, raw_key = api_key_create(tenant=tenant, name="short", expires_at=timezone.now() + timedelta(hours=1))
    client = _client(raw_key)
    assert client.get("/v1/files").status_code == 200
    ApiKey.objects.filter(id=key.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    error = _error(client.get("/v1/files"))
    assert "expired at" in error["message"] and key.prefix in error["message"]
    # The tenant's other key is unaffected.
    assert _client(tenant.raw_key).get("/v1/files").status_code == 200


def test_an_unknown_key_still_gets_the_generic_message(db):
    assert _error(_client("sk-cp-nope").get("/v1/files"))["message"] == "Incorrect API key provided."


def test_a_key_cannot_be_created_already_expired(tenant):
    with pytest.raises(ValidationFailed, match="not in the future"):
        api_key_create(tenant=tenant, expires_at=timezone.now() - timedelta(minutes=1))


def test_revoke_is_recorded_once_and_never_undone(tenant):
    key = ApiKey.objects.get(tenant=tenant)
    assert api_key_revoke(key_id=key.id, actor="alice") is True
    revoked_at = ApiKey.objects.get(id=key.id).revoked_at
    assert api_key_revoke(key_id=key.id, actor="bob") is False  # a second click changes nothing
    assert ApiKey.objects.get(id=key.id).revoked_at == revoked_at
    event = TenantEvent.objects.get(tenant=tenant, kind="key_revoked")
    assert event.actor == "alice" and key.prefix in event.message
    with pytest.raises(NotFound):
        api_key_revoke(key_id=key.id + 1000, actor="alice")


def test_admin_revoke_action_goes_through_the_service(admin_client, tenant, other_tenant):
    keys = list(ApiKey.objects.order_by("id"))
    response = admin_client.post(KEYS, {"action": "revoke", "_selected_action": [k.id for k in keys]})
    assert response.status_code == 302
    assert not ApiKey.objects.filter(revoked_at__isnull=True).exists()
    assert [m.message for m in get_messages(response.wsgi_request)] == [
        f"Revoked: {', '.join(k.prefix + '…' for k in keys)}."
    ]
    assert TenantEvent.objects.filter(kind="key_revoked", actor="admin").count() == 2


def test_admin_cannot_unrevoke_by_editing_the_field(admin_client, tenant):
    key = ApiKey.objects.get(tenant=tenant)
    api_key_revoke(key_id=key.id, actor="ops")
    page = admin_client.get(f"{KEYS}{key.id}/change/").content.decode()
    assert 'name="revoked_at' not in page and 'name="expires_at' in page
    # A forged POST that blanks revoked_at is ignored: the field is not on the form.
    response = admin_client.post(
        f"{KEYS}{key.id}/change/",
        {"name": "renamed", "expires_at_0": "", "expires_at_1": "", "revoked_at_0": "", "revoked_at_1": ""},
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    key.refresh_from_db()
    assert key.name == "renamed" and key.revoked_at is not None
    # Nor in the tenant page's inline.
    page = admin_client.get(f"/admin/tenants/tenant/{tenant.id}/change/").content.decode()
    assert 'name="api_keys-0-revoked_at' not in page and 'name="api_keys-0-expires_at' in page


def test_commands_set_an_expiry(catalogue):
    out = StringIO()
    call_command("tenant_create", "temp", "--expires-in", "2d", stdout=out)
    raw_key = out.getvalue().strip().splitlines()[-1]
    key = ApiKey.objects.get(tenant__name="temp")
    assert timedelta(days=2) - timedelta(minutes=1) < key.expires_at - timezone.now() <= timedelta(days=2)
    assert _client(raw_key).get("/v1/files").status_code == 200

    out = StringIO()
    call_command("api_key_create", "temp", "--name", "ci", "--expires-at", "2099-01-01T00:00:00", stdout=out)
    second = ApiKey.objects.get(tenant__name="temp", name="ci")
    assert second.expires_at.isoformat() == "2099-01-01T00:00:00+00:00"  # no offset: UTC
    assert _client(out.getvalue().strip().splitlines()[-1]).get("/v1/files").status_code == 200

    call_command("api_key_revoke", second.prefix, stdout=StringIO())
    assert ApiKey.objects.get(id=second.id).revoked_at is not None
    assert ApiKey.objects.get(id=key.id).revoked_at is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["tenant_create", "x", "--expires-in", "soon"], "--expires-in must be"),
        (["tenant_create", "x", "--expires-at", "tomorrow"], "--expires-at must be"),
        (["tenant_create", "x", "--expires-at", "2001-01-01T00:00:00Z"], "not in the future"),
        (["api_key_create", "nobody"], "No tenant named 'nobody'"),
        (["api_key_revoke", "sk-cp-none"], "0 keys have the prefix"),
    ],
)
def test_commands_refuse_bad_input(db, args, message):
    with pytest.raises(CommandError, match=message):
        call_command(*args, stdout=StringIO())
    assert not Tenant.objects.filter(name="x").exists()
