"""Domain errors and the single place that turns them into HTTP responses.

Bodies follow OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``, so the
official SDK raises its usual typed exceptions (NotFoundError, BadRequestError, ...) with our message.
"""

from __future__ import annotations

import logging
from typing import Any

from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)


class DomainError(Exception):
    status_code = 400
    error_type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class ValidationFailed(DomainError):
    status_code = 400


class NotFound(DomainError):
    status_code = 404
    code = "not_found"


class Conflict(DomainError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(DomainError):
    status_code = 413
    code = "file_too_large"


class QuotaExceeded(DomainError):
    status_code = 429
    error_type = "rate_limit_error"
    code = "quota_exceeded"


def error_body(message: str, *, error_type: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def _first_message(detail: Any) -> tuple[str, str | None]:
    """Flatten DRF's nested validation detail into one sentence naming the field."""
    if isinstance(detail, dict):
        for field, value in detail.items():
            message, _ = _first_message(value)
            param = None if field == "non_field_errors" else str(field)
            return (f"{param}: {message}" if param else message), param
    if isinstance(detail, list) and detail:
        return _first_message(detail[0])
    return str(detail), None


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Imported here: rest_framework.views loads the authentication classes, which import this module.
    from rest_framework.views import exception_handler as drf_default_handler

    if isinstance(exc, DomainError):
        return Response(
            error_body(exc.message, error_type=exc.error_type, param=exc.param, code=exc.code),
            status=exc.status_code,
        )
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    if isinstance(exc, drf_exceptions.APIException):
        response = drf_default_handler(exc, context)
        if response is None:
            return None
        message, param = _first_message(exc.detail)
        error_type = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}.get(
            exc.status_code, "invalid_request_error"
        )
        code = exc.default_code if isinstance(exc.detail, str) or param is None else "invalid_value"
        response.data = error_body(message, error_type=error_type, param=param, code=code)
        return response
    # Anything else is our bug: log it with the request path and answer in the same shape.
    request = context.get("request")
    logger.exception("unhandled error on %s", getattr(request, "path", "?"))
    return Response(
        error_body("Internal server error.", error_type="server_error", param=None, code="internal_error"),
        status=500,
    )
