"""``/v1/webhook_endpoints``: OpenAI's webhook endpoint API, so ``client.webhooks.create/retrieve/update/
list/delete/rotate_secret/test`` of the openai SDK work unchanged; ``/v1/webhook_event_types`` lists what we
send; ``/v1/webhook_endpoints/{id}/deliveries`` (an extension) is the endpoint's delivery log."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.errors import ValidationFailed
from controlplane.core.pagination import cursor_page, parse_limit
from controlplane.tenants.auth import request_tenant
from controlplane.webhooks import schema, selectors, services
from controlplane.webhooks.models import EVENT_TYPES
from controlplane.webhooks.render import delivery_render, endpoint_render


def _body(request: Request) -> dict[str, Any]:
    data = request.data if request.data else {}
    if not isinstance(data, dict):
        raise ValidationFailed("The request body must be a JSON object.")
    return data


@schema.endpoint_list_create
class WebhookEndpointListCreateView(APIView):
    def get(self, request: Request) -> Response:
        page = cursor_page(
            selectors.webhook_endpoint_list(tenant=request_tenant(request)),
            after=request.query_params.get("after"),
            limit=parse_limit(request.query_params.get("limit")),
            render=lambda endpoints: [endpoint_render(e) for e in endpoints],
        )
        return Response(page)

    def post(self, request: Request) -> Response:
        data = _body(request)
        if "url" not in data:
            raise ValidationFailed("Missing required parameter: 'url'.", param="url")
        endpoint = services.webhook_endpoint_create(
            tenant=request_tenant(request), url=data["url"], name=data.get("name"), event_types=data.get("event_types")
        )
        return Response(endpoint_render(endpoint, with_secret=True))


@schema.endpoint_detail
class WebhookEndpointDetailView(APIView):
    def get(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        return Response(endpoint_render(endpoint))

    def post(self, request: Request, endpoint_id: str) -> Response:
        data = _body(request)
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        endpoint = services.webhook_endpoint_update(
            endpoint=endpoint, url=data.get("url"), name=data.get("name"), event_types=data.get("event_types")
        )
        return Response(endpoint_render(endpoint))

    def delete(self, request: Request, endpoint_id: str) -> Response:
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        services.webhook_endpoint_delete(endpoint=endpoint)
        return Response({"id": endpoint.id, "object": "webhook_endpoint.deleted", "deleted": True})


@schema.endpoint_rotate_secret
class WebhookEndpointRotateSecretView(APIView):
    def post(self, request: Request, endpoint_id: str) -> Response:
        data = _body(request)
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        endpoint = services.webhook_endpoint_rotate_secret(
            endpoint=endpoint,
            keep_old_secret_active_for_24_hours=data.get("keep_old_secret_active_for_24_hours", False),
        )
        return Response(endpoint_render(endpoint, with_secret=True))


@schema.endpoint_test
class WebhookEndpointTestView(APIView):
    def post(self, request: Request, endpoint_id: str) -> Response:
        data = _body(request)
        endpoint = selectors.webhook_endpoint_get(tenant=request_tenant(request), endpoint_id=endpoint_id)
        outcome = services.webhook_endpoint_test(endpoint=endpoint, event_type=data.get("event_type"))
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
                "event_type": data["event_type"],
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
        page = cursor_page(
            selectors.webhook_delivery_list(endpoint=endpoint, status=request.query_params.get("status")),
            after=request.query_params.get("after"),
            limit=parse_limit(request.query_params.get("limit")),
            render=lambda deliveries: [delivery_render(d) for d in deliveries],
        )
        return Response(page)
