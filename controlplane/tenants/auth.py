"""Bearer API-key authentication: the request's tenant is ``request.user``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions

from controlplane.tenants.models import ApiKey, Tenant
from controlplane.tenants.services import hash_api_key

# Writing last_used_at on every request would make each API call a write; once a minute is enough.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[Tenant, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header:
            return None
        scheme, _, raw_key = header.partition(" ")
        if scheme.lower() != "bearer" or not raw_key.strip():
            raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
        key = (
            ApiKey.objects.select_related("tenant")
            .filter(key_hash=hash_api_key(raw_key.strip()), revoked_at__isnull=True)
            .first()
        )
        if key is None or not key.tenant.is_active:
            raise exceptions.AuthenticationFailed("Incorrect API key provided.")
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > _LAST_USED_RESOLUTION:
            ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        return key.tenant, key

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="api"'


class IsTenant(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.user, Tenant)
