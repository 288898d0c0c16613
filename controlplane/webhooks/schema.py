"""The webhook endpoint API: the request serializers the views validate with (core/http/input.py) and the
OpenAPI description built from them. The response serializers only document (core/http/openapi.py says why):
they mirror render.py, and the fuzz test checks real responses against them."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers

from controlplane.core.http.input import StrictBooleanField, StrictCharField, strict_choice
from controlplane.core.http.openapi import RESPONSE_HEADERS, cursor_page_of, error_responses, path_id
from controlplane.core.http.pagination import CursorQuerySerializer
from controlplane.webhooks.models import EVENT_TYPES, DeliveryStatus
from controlplane.webhooks.services import MAX_ENDPOINTS_PER_TENANT, MAX_NAME_LENGTH
from controlplane.webhooks.urlguard import MAX_URL_LENGTH

TAGS = ["Webhooks"]
_ENDPOINT_ID = path_id("endpoint_id", "we_abc123")
_URL_HELP = (
    "Where events are POSTed (https, or http). A host that resolves to a private, loopback, link-local, "
    "multicast or reserved address is refused (400)."
)
_EVENT_TYPES_HELP = "The events sent to this endpoint; absent on create: all of them."


def _unix(help_text: str = "Unix time (seconds).", *, allow_null: bool = False) -> serializers.IntegerField:
    return serializers.IntegerField(allow_null=allow_null, help_text=help_text)


def _event_types(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=strict_choice(list(EVENT_TYPES)), min_length=1, help_text=_EVENT_TYPES_HELP, **kwargs
    )


class WebhookEndpointSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["webhook_endpoint"])
    created_at = _unix()
    updated_at = _unix("Unix time of the last change of the URL, name, event types or secret.")
    name = serializers.CharField(allow_blank=True)
    url = serializers.CharField()
    event_types = _event_types()
    signing_secret_hint = serializers.CharField(help_text="The secret's last characters.")
    enabled = serializers.BooleanField(help_text="Extension: false while an operator has paused the endpoint.")


class WebhookEndpointWithSecretSerializer(WebhookEndpointSerializer):
    signing_secret = serializers.CharField(
        help_text="`whsec_…`: verify deliveries with it (`client.webhooks.unwrap(body, headers, secret=...)`). "
        "Shown only in this answer."
    )


WebhookEndpointListSerializer = cursor_page_of(WebhookEndpointSerializer, name="WebhookEndpointList")


class WebhookEndpointCreateSerializer(serializers.Serializer[Any]):
    url = StrictCharField(max_length=MAX_URL_LENGTH, help_text=_URL_HELP)
    name = StrictCharField(max_length=MAX_NAME_LENGTH, required=False, allow_blank=True, allow_null=True)
    event_types = _event_types(required=False, allow_null=True)


class WebhookEndpointUpdateSerializer(serializers.Serializer[Any]):
    # null, like absent, leaves a field unchanged (services.webhook_endpoint_update).
    url = StrictCharField(max_length=MAX_URL_LENGTH, required=False, allow_null=True, help_text=_URL_HELP)
    name = StrictCharField(max_length=MAX_NAME_LENGTH, required=False, allow_blank=True, allow_null=True)
    event_types = _event_types(required=False, allow_null=True)


class DeletedWebhookEndpointSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["webhook_endpoint.deleted"])
    deleted = serializers.BooleanField()


class RotateSecretSerializer(serializers.Serializer[Any]):
    keep_old_secret_active_for_24_hours = StrictBooleanField(
        required=False, help_text="Sign with both secrets for 24 hours (default: the old one stops now)."
    )


class TestRequestSerializer(serializers.Serializer[Any]):
    event_type = strict_choice(list(EVENT_TYPES))


class TestResultSerializer(serializers.Serializer[Any]):
    object = serializers.ChoiceField(choices=["webhook_endpoint.test"])
    webhook_endpoint_id = serializers.CharField()
    event_type = serializers.CharField()
    status_code = serializers.IntegerField(help_text="The endpoint's HTTP status.")
    success = serializers.BooleanField()


class EventTypeListSerializer(serializers.Serializer[Any]):
    object = serializers.ChoiceField(choices=["list"])
    data = serializers.ListField(  # type: ignore[assignment]  # a field: DRF's metaclass pops it
        child=serializers.ChoiceField(choices=list(EVENT_TYPES))
    )


class EventDataSerializer(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="The batch id.")


class EventSerializer(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="`evt_…`: the same for every endpoint that receives the event.")
    object = serializers.ChoiceField(choices=["event"])
    type = serializers.ChoiceField(choices=list(EVENT_TYPES))
    created_at = _unix("Unix time the batch reached the state.")
    data = EventDataSerializer()  # type: ignore[assignment]  # a field: DRF's metaclass pops it


class DeliverySerializer(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="`wh_…`: the `webhook-id` header, the same on every attempt.")
    object = serializers.ChoiceField(choices=["webhook_delivery"])
    webhook_endpoint_id = serializers.CharField()
    event = EventSerializer(help_text="The body sent.")
    status = serializers.ChoiceField(
        choices=DeliveryStatus.values,
        help_text="`failed`: the last attempt failed and another is scheduled; `exhausted`: no 2xx in 24 hours; "
        "`dropped`: given up unsent because the endpoint had too many deliveries waiting.",
    )
    attempts = serializers.IntegerField()
    created_at = _unix()
    last_attempt_at = _unix(allow_null=True)
    next_attempt_at = _unix("Unix time of the next attempt; null once it succeeded or is exhausted.", allow_null=True)
    last_status_code = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)
    succeeded_at = _unix(allow_null=True)


DeliveryListSerializer = cursor_page_of(DeliverySerializer, name="DeliveryList")


class DeliveryListQuerySerializer(CursorQuerySerializer):
    status = strict_choice(list(DeliveryStatus.values), required=False, help_text="Only deliveries in this state.")


endpoint_list_create = extend_schema_view(
    get=extend_schema(
        operation_id="listWebhookEndpoints",
        summary="List the tenant's webhook endpoints",
        tags=TAGS,
        parameters=[CursorQuerySerializer, *RESPONSE_HEADERS],
        responses={200: WebhookEndpointListSerializer, **error_responses()},
    ),
    post=extend_schema(
        operation_id="createWebhookEndpoint",
        summary="Register a webhook endpoint",
        description="Terminal batch states are POSTed to it as OpenAI's `batch.*` events, signed per Standard "
        "Webhooks with the `signing_secret` returned here (and only here).",
        tags=TAGS,
        request={"application/json": WebhookEndpointCreateSerializer},
        parameters=RESPONSE_HEADERS,
        responses={
            200: WebhookEndpointWithSecretSerializer,
            **error_responses(
                413, 415, described={409: f"The tenant has {MAX_ENDPOINTS_PER_TENANT} endpoints, the most allowed."}
            ),
        },
    ),
)

endpoint_detail = extend_schema_view(
    get=extend_schema(
        operation_id="retrieveWebhookEndpoint",
        summary="Retrieve a webhook endpoint",
        tags=TAGS,
        parameters=[_ENDPOINT_ID, *RESPONSE_HEADERS],
        responses={200: WebhookEndpointSerializer, **error_responses(404)},
    ),
    post=extend_schema(
        operation_id="updateWebhookEndpoint",
        summary="Change a webhook endpoint's URL, name or event types",
        tags=TAGS,
        request={"application/json": WebhookEndpointUpdateSerializer},
        parameters=[_ENDPOINT_ID, *RESPONSE_HEADERS],
        responses={200: WebhookEndpointSerializer, **error_responses(404, 413, 415)},
    ),
    delete=extend_schema(
        operation_id="deleteWebhookEndpoint",
        summary="Delete a webhook endpoint (and its delivery log)",
        tags=TAGS,
        parameters=[_ENDPOINT_ID, *RESPONSE_HEADERS],
        responses={200: DeletedWebhookEndpointSerializer, **error_responses(404)},
    ),
)

endpoint_rotate_secret = extend_schema_view(
    post=extend_schema(
        operation_id="rotateWebhookEndpointSecret",
        summary="Give a webhook endpoint a new signing secret",
        tags=TAGS,
        request={"application/json": RotateSecretSerializer},
        parameters=[_ENDPOINT_ID, *RESPONSE_HEADERS],
        responses={200: WebhookEndpointWithSecretSerializer, **error_responses(404, 413, 415)},
    ),
)

endpoint_test = extend_schema_view(
    post=extend_schema(
        operation_id="testWebhookEndpoint",
        summary="Send a sample event to a webhook endpoint and report its answer",
        description="A 400 `webhook_delivery_failed` when no HTTP answer came (refused address, DNS, connection, "
        "timeout); any HTTP status the endpoint answers is in `status_code`.",
        tags=TAGS,
        request={"application/json": TestRequestSerializer},
        parameters=[_ENDPOINT_ID, *RESPONSE_HEADERS],
        responses={200: TestResultSerializer, **error_responses(404, 413, 415)},
    ),
)

event_types = extend_schema_view(
    get=extend_schema(
        operation_id="listWebhookEventTypes",
        summary="The event types this service sends",
        tags=TAGS,
        parameters=RESPONSE_HEADERS,
        responses={200: EventTypeListSerializer, **error_responses()},
    ),
)

delivery_list = extend_schema_view(
    get=extend_schema(
        operation_id="listWebhookDeliveries",
        summary="A webhook endpoint's delivery log, newest first",
        description="Extension. One entry per event sent to the endpoint, with its attempts so far.",
        tags=TAGS,
        parameters=[
            _ENDPOINT_ID,
            DeliveryListQuerySerializer,
            *RESPONSE_HEADERS,
        ],
        responses={200: DeliveryListSerializer, **error_responses(404)},
    ),
)
