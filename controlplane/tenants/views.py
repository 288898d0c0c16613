"""The edge's API-key check: nginx asks it (auth_request, deploy/k8s/base/nginx.conf) before it reads an
upload's body, so a request without a usable key never fills the proxy's temporary directory."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_safe
from rest_framework import exceptions

from controlplane.tenants.auth import usable_api_key


@require_safe
def edge_auth(request: HttpRequest) -> HttpResponse:
    """204 when the request's Authorization header names a usable API key, else 401; nothing is recorded (the
    upload itself is the API request that counts against the key's rate)."""
    header = request.headers.get("Authorization", "")
    try:
        usable_api_key(header, timezone.now())
    except exceptions.AuthenticationFailed:
        return HttpResponse(status=401)
    return HttpResponse(status=204)
