from __future__ import annotations

from django.db.models import QuerySet

from controlplane.core.http.errors import NotFound, ValidationFailed
from controlplane.tenants.models import Tenant
from controlplane.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint


def webhook_endpoint_get(*, tenant: Tenant, endpoint_id: str) -> WebhookEndpoint:
    """Another tenant's endpoint is indistinguishable from a missing one."""
    endpoint = WebhookEndpoint.objects.filter(tenant=tenant, id=endpoint_id).first()
    if endpoint is None:
        raise NotFound(f"No such webhook endpoint: {endpoint_id}", param="webhook_endpoint_id")
    return endpoint


def webhook_endpoint_list(*, tenant: Tenant) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(tenant=tenant)


def webhook_delivery_list(*, endpoint: WebhookEndpoint, status: str | None = None) -> QuerySet[WebhookDelivery]:
    deliveries = WebhookDelivery.objects.filter(endpoint_id=endpoint.id).select_related("event")
    if status is not None:
        if status not in DeliveryStatus.values:
            raise ValidationFailed(f"status must be one of {DeliveryStatus.values}.", param="status")
        deliveries = deliveries.filter(status=status)
    return deliveries
