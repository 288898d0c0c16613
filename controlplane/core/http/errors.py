"""Domain errors and the single place that turns them into HTTP responses.

Bodies follow OpenAI's error shape, ``{"error": {"message", "type", "param", "code"}}``, so the
official SDK raises its usual typed exceptions (NotFoundError, BadRequestError, ...) with our message.
A 429 also carries ``Retry-After`` and OpenAI's ``x-ratelimit-*`` headers, and names the limit in the body.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from django import db
from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.settings import api_settings

from controlplane.core.observability import metrics

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


# How much of a user's value an error message quotes: enough to recognise it, never a 100 MiB `errors`.
QUOTE_LIMIT = 200


def quote(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """``repr`` of a user value for an error message, cut to ``limit`` characters. The result is plain
    printable text (repr escapes NUL bytes and lone surrogates), so it can be stored in Postgres."""
    if isinstance(value, str) and len(value) > limit:
        value = value[:limit]  # cut before repr: a huge string is never copied whole
    try:
        text = repr(value)
    except RecursionError:  # a value nested deeper than repr can follow
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storable_text(text: str, limit: int = 2000) -> str:
    """Text that Postgres accepts in text and jsonb columns (no NUL, valid UTF-8), at most ``limit``
    characters: the last guard before a message built from user input is saved."""
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def ratelimit_headers(*, name: str, limit: int, remaining: int, reset_seconds: float) -> dict[str, str]:
    """OpenAI's headers for one limit: ``name`` is ``requests`` for the request rate, otherwise the quota
    (``enqueued-lines``); reset is written like OpenAI's ``12s``."""
    return {
        f"x-ratelimit-limit-{name}": str(limit),
        f"x-ratelimit-remaining-{name}": str(max(0, remaining)),
        f"x-ratelimit-reset-{name}": f"{whole_seconds(reset_seconds)}s",
    }


def whole_seconds(seconds: float) -> int:
    """Round a wait up to whole seconds, at least 1: HTTP's Retry-After has no fractions, and a client told
    0 would retry at once into the same limit."""
    return max(1, math.ceil(seconds))


class QuotaExceeded(DomainError):
    """Over a quota or rate limit. With ``limit`` set, the body names the limit
    (``{"name", "value", "current", "requested"}``) and the response carries its ``x-ratelimit-*`` headers;
    ``QuotaExceeded(message)`` alone still works and only gets a Retry-After."""

    status_code = 429
    error_type = "rate_limit_error"
    code = "quota_exceeded"
    # For callers that give no estimate: the quotas here free up as batches finish, minutes rather than
    # seconds, so a client polling faster than once a minute only adds load.
    default_retry_after = 60.0

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        limit: str | None = None,
        value: int | None = None,
        current: int | None = None,
        requested: int | None = None,
        retry_after: float | None = None,
        header_name: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message, param=param, code=code)
        self.limit = limit
        self.value = value
        self.current = current
        self.requested = requested
        self.retry_after = self.default_retry_after if retry_after is None else retry_after
        self.extra_headers = dict(headers or {})
        # ``max_enqueued_lines`` → ``x-ratelimit-*-enqueued-lines``; the request rate passes "requests".
        self.header_name = header_name or (limit.removeprefix("max_").replace("_", "-") if limit else None)

    def limit_body(self) -> dict[str, Any] | None:
        if self.limit is None:
            return None
        return {"name": self.limit, "value": self.value, "current": self.current, "requested": self.requested}

    def response_headers(self) -> dict[str, str]:
        headers = {"Retry-After": str(whole_seconds(self.retry_after))}
        if self.header_name and self.value is not None and self.current is not None:
            headers.update(
                ratelimit_headers(
                    name=self.header_name,
                    limit=self.value,
                    remaining=self.value - self.current,
                    reset_seconds=self.retry_after,
                )
            )
        headers.update(self.extra_headers)
        return headers


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


# A database restart or failover takes seconds; the SDK waits this long before its retry.
DB_UNAVAILABLE_RETRY_AFTER_S = 2


# How much of a message built from a DRF error is kept: enough to show the value at fault.
MESSAGE_LIMIT = 300


def validation_failed(detail: Any) -> ValidationFailed:
    """DRF's error detail (nested dicts and lists of ``ErrorDetail``) as one ``ValidationFailed`` naming the
    first field at fault."""
    param, error = _first_error(detail, path="")
    message = str(error)
    code = getattr(error, "code", None)
    if code == "required" and param:
        return ValidationFailed(
            f"Missing required parameter: {param!r}.", param=param, code="missing_required_parameter"
        )
    text = f"Invalid {param!r}: {message}" if param else message
    return ValidationFailed(storable_text(text, MESSAGE_LIMIT), param=param or None, code="invalid_value")


def _first_error(detail: Any, *, path: str) -> tuple[str, Any]:
    if isinstance(detail, Mapping):
        for key, value in detail.items():
            if not value:
                continue  # a valid item of a many=True list
            if key == api_settings.NON_FIELD_ERRORS_KEY:
                return _first_error(value, path=path)
            child = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
            return _first_error(value, path=child)
    if isinstance(detail, list) and detail:
        if all(isinstance(item, (dict, list)) for item in detail):  # a many=True list: one entry per item
            for index, item in enumerate(detail):
                if item:
                    return _first_error(item, path=f"{path}[{index}]")
        return _first_error(detail[0], path=path)
    return path, detail


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Imported here: rest_framework.views loads the authentication classes, which import this module.
    from rest_framework.views import exception_handler as drf_default_handler

    if isinstance(exc, drf_exceptions.ValidationError):
        exc = validation_failed(exc.detail)  # a serializer's is_valid(raise_exception=True)
    if isinstance(exc, QuotaExceeded):
        metrics.QUOTA_REJECTIONS.labels(limit=exc.limit or "unnamed").inc()
        body = error_body(exc.message, error_type=exc.error_type, param=exc.param, code=exc.code)
        limit = exc.limit_body()
        if limit is not None:
            body["error"]["limit"] = limit
        return Response(body, status=exc.status_code, headers=exc.response_headers())
    if isinstance(exc, DomainError):
        # The openai SDK retries every 409; ours are states (a batch already ended, a file in use) that a
        # retry a second later cannot change, so tell it not to.
        headers = {"x-should-retry": "false"} if exc.status_code == 409 else None
        return Response(
            error_body(exc.message, error_type=exc.error_type, param=exc.param, code=exc.code),
            status=exc.status_code,
            headers=headers,
        )
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    # Django's own limits on form and multipart bodies (DATA_UPLOAD_MAX_MEMORY_SIZE, ..._NUMBER_FIELDS,
    # ..._NUMBER_FILES) raise while DRF parses; they are the client's to fix, not a 500.
    if isinstance(exc, RequestDataTooBig):
        return Response(
            error_body(
                f"The form body is larger than the {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} byte limit "
                "(send JSON, or upload files to POST /v1/files as multipart).",
                error_type="invalid_request_error",
                param=None,
                code="request_too_large",
            ),
            status=413,
        )
    if isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        return Response(
            error_body(str(exc), error_type="invalid_request_error", param=None, code="too_many_fields"), status=400
        )
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
    request = context.get("request")
    if isinstance(exc, (db.OperationalError, db.InterfaceError)):
        # The database refused or dropped the connection (restart, failover, max_connections): not the
        # client's fault and not our bug; 503 with Retry-After, which the openai SDK retries.
        logger.warning("database unavailable on %s: %s", getattr(request, "path", "?"), exc)
        return Response(
            error_body(
                "The service's database is unavailable; retry shortly.",
                error_type="server_error",
                param=None,
                code="service_unavailable",
            ),
            status=503,
            headers={"Retry-After": str(DB_UNAVAILABLE_RETRY_AFTER_S)},
        )
    # Anything else is our bug: log it with the request path and answer in the same shape.
    logger.exception("unhandled error on %s", getattr(request, "path", "?"))
    return Response(
        error_body("Internal server error.", error_type="server_error", param=None, code="internal_error"),
        status=500,
    )
