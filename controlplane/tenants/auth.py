"""Bearer API-key authentication: the request's tenant is ``request.user``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from controlplane.tenants.models import ApiKey, Tenant
from controlplane.tenants.services import api_request_record, hash_api_key

# last_used_at is for operators recognising a live key: once a minute is precise enough, and saves a
# row update per request (the request counter's upsert touches its own small table).
_LAST_USED_RESOLUTION = timedelta(minutes=1)
# Where the request's RequestRate is left for RateLimitHeadersMiddleware (on the Django request, which
# the middleware sees; DRF's Request does not pass attribute writes through).
REQUEST_RATE_ATTR = "api_request_rate"


def usable_api_key(header: str, now: datetime) -> ApiKey:
    """The usable key an ``Authorization: Bearer`` header names (its tenant loaded), or AuthenticationFailed.
    Reads only: the API's authentication below records the request, the edge's check (views.py) does not."""
    scheme, _, raw_key = header.partition(" ")
    if scheme.lower() != "bearer" or not raw_key.strip():
        raise exceptions.AuthenticationFailed("Use 'Authorization: Bearer <api key>'.")
    key = ApiKey.objects.select_related("tenant").filter(key_hash=hash_api_key(raw_key.strip())).first()
    if key is None or not key.tenant.is_active:
        raise exceptions.AuthenticationFailed("Incorrect API key provided.")
    # Naming the reason leaks nothing: only the holder of the key's secret can reach this line.
    reason = key.unusable_reason(now)
    if reason is not None:
        raise exceptions.AuthenticationFailed(f"{reason} Use another key.")
    return key


class ApiKeyAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request: Any) -> tuple[Tenant, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header:
            return None
        now = timezone.now()
        key = usable_api_key(header, now)
        # Counted here, so every authenticated API request is, whatever the view; over the limit is a 429.
        rate = api_request_record(api_key=key, now=now)
        setattr(request._request, REQUEST_RATE_ATTR, rate)
        if key.last_used_at is None or now - key.last_used_at > _LAST_USED_RESOLUTION:
            ApiKey.objects.filter(id=key.id).update(last_used_at=now)
        return key.tenant, key

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="api"'


class IsTenant(permissions.BasePermission):
    def has_permission(self, request: Any, view: Any) -> bool:
        return isinstance(request.user, Tenant)


def request_tenant(request: Request) -> Tenant:
    """The authenticated tenant of an API request (``request.user``, typed).

    IsTenant, the default permission, has already refused any request whose user is not a Tenant, so the
    check below only narrows the type; it raises the same 401 rather than pass on a wrong user.
    """
    user = request.user
    if not isinstance(user, Tenant):
        raise exceptions.NotAuthenticated()
    return user
