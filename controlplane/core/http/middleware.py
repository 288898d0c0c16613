"""Refuses URLs that no view could look up: a NUL in the path or the query string (``?after=%00``) would
reach a Postgres query, which refuses NUL in text, and end as a 500."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponseBase, JsonResponse

from controlplane.core.http.errors import error_body


class RejectNulMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if "\x00" in request.path or any(
            "\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists()
        ):
            body = error_body(
                "The URL holds a NUL character.", error_type="invalid_request_error", param=None, code="invalid_url"
            )
            return JsonResponse(body, status=400)
        return self.get_response(request)
