"""What every app's OpenAPI description shares: the error object, the documented error responses, and the
request and response headers of the tenant API (drf-spectacular; served at ``/v1/openapi.json``).

Requests: each app's ``schema.py`` declares its bodies and query parameters as serializers, which the views
validate with (core/http/input.py), so the schema describes the checks that run. Responses: the views render
OpenAI's objects as plain dicts, field for field (each app's ``render.py``), so their schema cannot be derived
from them and the response serializers exist for the documentation only. Two tests keep that description and
behaviour together: tests/test_openapi.py validates the schema, and tests/test_api_fuzz.py (schemathesis)
checks real responses against it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import serializers

from controlplane.core.http.idempotency import HEADER as IDEMPOTENCY_HEADER
from controlplane.core.http.idempotency import REPLAYED_HEADER


class ErrorLimitSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(help_text="The tenant setting that was hit, e.g. `max_enqueued_lines`.")
    value = serializers.IntegerField(allow_null=True, help_text="The limit.")
    current = serializers.IntegerField(allow_null=True, help_text="Usage before this request.")
    requested = serializers.IntegerField(allow_null=True, help_text="What this request asked for.")


class ErrorSerializer(serializers.Serializer[Any]):
    message = serializers.CharField()
    type = serializers.CharField(
        help_text="`invalid_request_error`, `authentication_error`, `permission_error`, `rate_limit_error` "
        "or `server_error`."
    )
    param = serializers.CharField(allow_null=True, help_text="The parameter at fault, when there is one.")
    code = serializers.CharField(allow_null=True)
    limit = ErrorLimitSerializer(required=False, help_text="Only on a 429 for a named quota or rate limit.")


class ErrorResponseSerializer(serializers.Serializer[Any]):
    """OpenAI's error body: the official SDK raises its typed exceptions (BadRequestError, ...) from it."""

    error = ErrorSerializer()


def cursor_page_of(item: type[serializers.Serializer[Any]], *, name: str) -> type[serializers.Serializer[Any]]:
    """The list object that ``pagination.cursor_page`` renders around ``item``, as the component
    ``name`` (drf-spectacular names a component after its serializer class)."""
    fields: dict[str, Any] = {
        "object": serializers.ChoiceField(choices=["list"]),
        "data": item(many=True),
        "first_id": serializers.CharField(allow_null=True),
        "last_id": serializers.CharField(allow_null=True),
        "has_more": serializers.BooleanField(),
    }
    return type(f"{name}Serializer", (serializers.Serializer,), fields)


_ERROR_DESCRIPTIONS = {
    400: "Invalid request: a parameter, the body, a header or the URL; `error.param` names the culprit.",
    401: "No API key, or an unknown, revoked or expired one.",
    404: "No such object for this tenant (another tenant's id is not found either).",
    409: f"The `{IDEMPOTENCY_HEADER}` was used with a different request (`idempotency_key_reused`), or a "
    "request with it is still running (`idempotency_key_in_progress`, retryable).",
    413: "The body is over the size limit (`FILE_MAX_BYTES` for uploads, `API_MAX_JSON_BYTES` for JSON).",
    415: "A `Content-Type` this operation does not read.",
    429: "Over the key's request rate or a tenant quota: `Retry-After` and `x-ratelimit-*` say when to retry, "
    "`error.limit` names the limit.",
}


def error_responses(*statuses: int, described: Mapping[int, str] | None = None) -> dict[int, OpenApiResponse]:
    """Documented error responses: ``statuses`` with the usual descriptions, ``described`` with the
    operation's own. Every authenticated operation can also answer 400 (a NUL in the URL), 401 and 429 (the
    key's request rate), so those are always included."""
    descriptions = {status: _ERROR_DESCRIPTIONS[status] for status in {400, 401, 429, *statuses}}
    descriptions.update(described or {})
    return {
        status: OpenApiResponse(ErrorResponseSerializer, description=descriptions[status])
        for status in sorted(descriptions)
    }


def path_id(name: str, example: str) -> OpenApiParameter:
    return OpenApiParameter(name, str, OpenApiParameter.PATH, description=f"The object's id, e.g. `{example}`.")


IDEMPOTENCY_KEY = OpenApiParameter(
    IDEMPOTENCY_HEADER,
    {"type": "string", "minLength": 1, "maxLength": 255},
    OpenApiParameter.HEADER,
    description="Makes the create safe to retry: the same key with the same request within 24 hours returns "
    f"the first answer (with `{REPLAYED_HEADER}: true`) instead of creating a second object; with a different "
    "request it is a 409.",
)

# Response headers. ``response=`` limits them to those statuses; none is required, since an unauthenticated
# request's answer carries no rate headers.
RESPONSE_HEADERS = [
    OpenApiParameter(
        "Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[429], description="Seconds to wait."
    ),
    *(
        OpenApiParameter(
            f"x-ratelimit-{kind}-requests",
            str,
            OpenApiParameter.HEADER,
            response=True,
            description=f"The {kind} of the API key's per-minute request rate.",
        )
        for kind in ("limit", "remaining", "reset")
    ),
]

REPLAYED = OpenApiParameter(
    REPLAYED_HEADER,
    str,
    OpenApiParameter.HEADER,
    response=[200],
    description=f"`true` when the answer is the stored one of an earlier request with the same `{IDEMPOTENCY_HEADER}`.",
)


def response_links_add(schema: dict[str, Any], *, operation_id: str, links: Mapping[str, dict[str, Any]]) -> None:
    """Add OpenAPI links to an operation's 200 response (drf-spectacular has no annotation for them): they
    tell clients, and schemathesis' stateful tests, which later calls take a value from the answer."""
    for operations in schema["paths"].values():
        for operation in operations.values():
            if operation.get("operationId") == operation_id:
                operation["responses"]["200"].setdefault("links", {}).update(links)
                return
    raise LookupError(f"no operation {operation_id!r} in the schema")


def link(operation_id: str, *, description: str, **parameters: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": parameters, "description": description}
