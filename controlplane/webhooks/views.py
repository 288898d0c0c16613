"""``/v1/webhook_endpoints``: OpenAI's webhook endpoint API, so ``client.webhooks.create/retrieve/update/
list/delete/rotate_secret/test`` of the openai SDK work unchanged; ``/v1/webhook_event_types`` lists what we
send; ``/v1/webhook_endpoints/{id}/deliveries`` (an extension) is the endpoint's delivery log."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.http.errors import ValidationFailed
from controlplane.core.http.input import input_validate
from controlplane.core.http.pagination import CursorQuerySerializer, cursor_page
from controlplane.tenants.auth import request_tenant
from controlplane.webhooks import schema, selectors, services
from controlplane.webhooks.models import EVENT_TYPES
from controlplane.webhooks.render import delivery_render, endpoint_render


@schema.endpoint_list_create
class WebhookEndpointListCreateView(APIView):
    def get(self, request: Request) -> Response:
        query = input_validate(CursorQuerySerializer, request.query_params)
        page = cursor_page(
            selectors.webhook_endpoint_list(tenant=request_tenant(request)),
            **query,
            render=lambda endpoints: [endpoint_render(e) for e in endpoints],
        )
        return Response(page)

    def post(self, request: Request) -> Response:
        body = input_validate(schema.WebhookEndpointCreateSerializer, request.data or {})
        endpoint = services.webhook_endpoint_create(tenant=request_tenant(request), **body)
        return Response(endpoint_render(endpoint, with_secret=True))


@schema.endpoint_detail
class WebhookEndpointDetailView(APIView):
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        return Response(endpoint_render(endpoint))

    def post(self, request: Request, endpoint_id: str) -> Response:
        body = input_validate(schema.WebhookEndpointUpdateSerializer, request.data or {})
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        return Response(endpoint_render(services.webhook_endpoint_update(endpoint=endpoint, **body)))

    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        services.webhook_endpoint_delete(endpoint=endpoint)
        return Response({"id": endpoint.id, "object": "webhook_endpoint.deleted", "deleted": True})


@schema.endpoint_rotate_secret
class WebhookEndpointRotateSecretView(APIView):
    def post(self, request: Request, endpoint_id: str) -> Response:
        body = input_validate(schema.RotateSecretSerializer, request.data or {})
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        endpoint = services.webhook_endpoint_rotate_secret(endpoint=endpoint, **body)
        return Response(endpoint_render(endpoint, with_secret=True))


@schema.endpoint_test
class WebhookEndpointTestView(APIView):
    def post(self, request: Request, endpoint_id: str) -> Response:
        body = input_validate(schema.TestRequestSerializer, request.data or {})
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        outcome = services.webhook_endpoint_test(endpoint=endpoint, **body)
        if outcome.status_code is None:
            raise ValidationFailed(
                f"The test event could not be delivered to {endpoint.url}: {outcome.error}",
                param="url",
                code="webhook_delivery_failed",
            )
        return Response(
            {
                "object": "webhook_endpoint.test",
                "webhook_endpoint_id": endpoint.id,
                "event_type": body["event_type"],
                "status_code": outcome.status_code,
                "success": True,
            }
        )


@schema.event_types
class WebhookEventTypesView(APIView):
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": list(EVENT_TYPES)})


@schema.delivery_list
class WebhookDeliveryListView(APIView):
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        query = input_validate(schema.DeliveryListQuerySerializer, request.query_params)
        page = cursor_page(
            selectors.webhook_delivery_list(endpoint=endpoint, status=query.pop("status", None)),
            **query,
            render=lambda deliveries: [delivery_render(d) for d in deliveries],
        )
        return Response(page)
