"""The API's objects: OpenAI's webhook endpoint (``client.webhooks.*`` in the openai SDK parses them) and
our delivery log entry (an extension)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from controlplane.webhooks.models import WebhookDelivery, WebhookEndpoint

# Characters of the secret a hint shows: enough to tell two secrets apart, far too few to guess one.
HINT_CHARS = 4


def _unix(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


def endpoint_render(endpoint: WebhookEndpoint, *, with_secret: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": endpoint.id,
        "object": "webhook_endpoint",
        "created_at": _unix(endpoint.created_at),
        "updated_at": _unix(endpoint.updated_at),
        "name": endpoint.name,
        "url": endpoint.url,
        "event_types": list(endpoint.event_types),
        "signing_secret_hint": f"whsec_…{endpoint.secret[-HINT_CHARS:]}",
        "enabled": endpoint.enabled,
    }
    if with_secret:
        body["signing_secret"] = endpoint.secret
    return body


def delivery_render(delivery: WebhookDelivery) -> dict[str, Any]:
    return {
        "id": delivery.id,
        "object": "webhook_delivery",
        "webhook_endpoint_id": delivery.endpoint_id,
        "event": json.loads(delivery.event.body),
        "status": delivery.status,
        "attempts": delivery.attempts,
        "created_at": _unix(delivery.created_at),
        "last_attempt_at": _unix(delivery.last_attempt_at),
        "next_attempt_at": _unix(delivery.next_attempt_at),
        "last_status_code": delivery.last_status_code,
        "last_error": delivery.last_error or None,
        "succeeded_at": _unix(delivery.succeeded_at),
    }
