"""The edge's API-key check (controlplane.tenants.views.edge_auth), which nginx asks before it reads an upload's
body (deploy/k8s/base/nginx.conf, tests/deploy/test_edge_limits.py): 204 for a usable key, 401 for anything
else, and nothing recorded against the key (the upload that follows is the request that counts)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from controlplane.tenants.models import ApiKey, ApiKeyRequestWindow, Tenant

pytestmark = pytest.mark.django_db

AUTH = "/internal/edge/auth"


def _status(authorization: str | None) -> int:
    headers = {} if authorization is None else {"HTTP_AUTHORIZATION": authorization}
    return Client().get(AUTH, **headers).status_code


def test_a_usable_key_passes_and_is_not_counted(tenant):
    before = ApiKey.objects.get(tenant=tenant).last_used_at
    assert _status(f"Bearer {tenant.raw_key}") == 204
    assert not ApiKeyRequestWindow.objects.exists()
    assert ApiKey.objects.get(tenant=tenant).last_used_at == before


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Basic abc", "Bearer not-a-key"])
def test_no_key_or_a_wrong_one_is_refused(tenant, authorization):
    assert _status(authorization) == 401


def test_a_revoked_or_expired_key_or_an_inactive_tenant_is_refused(tenant):
    key = ApiKey.objects.get(tenant=tenant)
    ApiKey.objects.filter(id=key.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _status(f"Bearer {tenant.raw_key}") == 401
    ApiKey.objects.filter(id=key.id).update(expires_at=None, revoked_at=timezone.now())
    assert _status(f"Bearer {tenant.raw_key}") == 401
    ApiKey.objects.filter(id=key.id).update(revoked_at=None)
    assert _status(f"Bearer {tenant.raw_key}") == 204
    Tenant.objects.filter(id=tenant.id).update(is_active=False)
    assert _status(f"Bearer {tenant.raw_key}") == 401


def test_only_safe_methods(tenant):
    assert Client().post(AUTH, HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}").status_code == 405
