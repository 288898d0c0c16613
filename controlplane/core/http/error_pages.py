"""Django's own error pages (a URL that matches no route, an error outside DRF) for the API's paths, in
OpenAI's error shape. DRF's exception handler (core/http/errors.py) covers everything that reaches a view; these
cover what does not: ``/v1/files/a%2Fb`` (the slash splits the id), ``/v1/nope``, a trailing slash, or a
crash in middleware. Paths outside ``/v1/`` (the admin) keep Django's HTML pages."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from controlplane.core.http.errors import error_body

API_PREFIX = "/v1/"


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIX)


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.bad_request(request, exception)
    body = error_body("Bad request.", error_type="invalid_request_error", param=None, code="bad_request")
    return JsonResponse(body, status=400)


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    if not _is_api(request):
        return defaults.page_not_found(request, exception)
    body = error_body(
        f"Unknown request URL: {request.method} {request.path}. Check the path (no trailing slash) and that "
        "an id holds no '/'.",
        error_type="invalid_request_error",
        param=None,
        code="unknown_url",
    )
    return JsonResponse(body, status=404)


def server_error(request: HttpRequest) -> HttpResponse:
    if not _is_api(request):
        return defaults.server_error(request)
    body = error_body("Internal server error.", error_type="server_error", param=None, code="internal_error")
    return JsonResponse(body, status=500)
