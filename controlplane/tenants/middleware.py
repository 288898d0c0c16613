"""Puts the key's request-rate headers (``x-ratelimit-*-requests``) on every API response, as OpenAI does."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase

from controlplane.tenants.auth import REQUEST_RATE_ATTR
from controlplane.tenants.services import RequestRate


class RateLimitHeadersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.get_response(request)
        # Set by ApiKeyAuthentication once the request is counted; absent for the admin and unauthenticated.
        rate: RequestRate | None = getattr(request, REQUEST_RATE_ATTR, None)
        if rate is not None:
            for name, value in rate.headers().items():
                if not response.has_header(name):  # a 429's own headers win
                    response[name] = value
        return response
