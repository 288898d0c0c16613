"""Webhook writes: endpoints (tenant API and admin), the events of terminal batch states, redelivery.

Delivering itself (attempts, backoff, the sweep) is in attempts.py."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.core.http.errors import Conflict, QuotaExceeded, ValidationFailed, quote
from controlplane.core.messaging import dispatch
from controlplane.tenants.models import Tenant
from controlplane.webhooks import inflight
from controlplane.webhooks.delivery import Outcome, post, secret_new
from controlplane.webhooks.models import (
    EVENT_TYPES,
    DeliveryStatus,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookEvent,
    new_delivery_id,
    new_event_id,
)
from controlplane.webhooks.urlguard import UrlPolicy, target_resolve

# Enough for a tenant's environments and tools; each terminal batch state costs one delivery per endpoint.
MAX_ENDPOINTS_PER_TENANT = 20
MAX_NAME_LENGTH = 256
# OpenAI's rotate_secret option keeps the old secret valid this long (messages carry both signatures).
SECRET_OVERLAP = timedelta(hours=24)


def _event_types_parse(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(item, str) for item in value):
        raise ValidationFailed("event_types must be a non-empty list of event type strings.", param="event_types")
    unknown = [item for item in value if item not in EVENT_TYPES]
    if unknown:
        raise ValidationFailed(
            f"event_types: {quote(unknown[0])} is not an event this service sends; choose from {list(EVENT_TYPES)}.",
            param="event_types",
        )
    return list(dict.fromkeys(value))


def _name_parse(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME_LENGTH or "\x00" in value:
        raise ValidationFailed(f"name must be a string of at most {MAX_NAME_LENGTH} characters.", param="name")
    return value


@contextmanager
def _web_thread_call(tenant_id: object) -> Iterator[None]:
    """A call that waits on a tenant's own server (its name server, its receiver) on a web thread: at most one
    per tenant and WEBHOOK_TEST_MAX_INFLIGHT in all in a process, each within WEBHOOK_TEST_TIMEOUT_SECONDS;
    more at once is a 429, so a tenant's slow server holds at most one thread of a process, for seconds."""
    caps = {"all": settings.WEBHOOK_TEST_MAX_INFLIGHT, f"tenant:{tenant_id}": 1}
    with inflight.TESTS.hold(caps) as admitted:
        if not admitted:
            raise QuotaExceeded(
                "A check or test call of your webhook endpoints is already in flight (or too many are); retry "
                "when it has finished.",
                code="webhook_test_in_flight",
                retry_after=settings.WEBHOOK_TEST_TIMEOUT_SECONDS,
            )
        yield


def _url_parse(value: object, *, tenant_id: object) -> str:
    """The checked URL. Resolved here, outside any transaction (a slow DNS answer holds no lock), as a web-thread
    call of the tenant's: create, update and test share its caps."""
    with _web_thread_call(tenant_id):
        target_resolve(value, policy=UrlPolicy.configured(), timeout=settings.WEBHOOK_TEST_TIMEOUT_SECONDS)
    assert isinstance(value, str)  # target_resolve refuses anything else
    return value


def webhook_endpoint_create(
    *, tenant: Tenant, url: object, name: object = None, event_types: object = None
) -> WebhookEndpoint:
    """A new endpoint with a new signing secret (returned once, in the create answer). Without
    ``event_types`` it receives every batch event."""
    types = list(EVENT_TYPES) if event_types is None else _event_types_parse(event_types)
    label = "" if name is None else _name_parse(name)
    checked_url = _url_parse(url, tenant_id=tenant.id)
    with transaction.atomic():
        # The tenant row lock makes the count below exact under concurrent creates.
        Tenant.objects.select_for_update().filter(id=tenant.id).first()
        if WebhookEndpoint.objects.filter(tenant_id=tenant.id).count() >= MAX_ENDPOINTS_PER_TENANT:
            raise Conflict(
                f"A tenant can have at most {MAX_ENDPOINTS_PER_TENANT} webhook endpoints; delete one first.",
                code="webhook_endpoint_limit",
            )
        return WebhookEndpoint.objects.create(
            tenant_id=tenant.id, url=checked_url, name=label, event_types=types, secret=secret_new()
        )


def webhook_endpoint_update(
    *, endpoint: WebhookEndpoint, url: object = None, name: object = None, event_types: object = None
) -> WebhookEndpoint:
    """Change what is given (None: unchanged). ``updated_at`` moves only when something changed."""
    changes: dict[str, Any] = {}
    if event_types is not None and (types := _event_types_parse(event_types)) != endpoint.event_types:
        changes["event_types"] = types
    if name is not None and (label := _name_parse(name)) != endpoint.name:
        changes["name"] = label
    if url is not None and url != endpoint.url:
        changes["url"] = _url_parse(url, tenant_id=endpoint.tenant_id)
    if changes:
        WebhookEndpoint.objects.filter(id=endpoint.id).update(**changes, updated_at=timezone.now())
    return WebhookEndpoint.objects.get(id=endpoint.id)


def webhook_endpoint_enable(*, endpoint: WebhookEndpoint, enabled: bool) -> WebhookEndpoint:
    """Operators pause (False) or resume an endpoint. A paused endpoint gets no new deliveries and its open
    ones wait; resumed, they go on (an attempt after their window closed is their last)."""
    WebhookEndpoint.objects.filter(id=endpoint.id).exclude(enabled=enabled).update(enabled=enabled)
    return WebhookEndpoint.objects.get(id=endpoint.id)


def webhook_endpoint_delete(*, endpoint: WebhookEndpoint) -> None:
    """The endpoint goes with its deliveries and their log: nothing more is sent to it."""
    WebhookEndpoint.objects.filter(id=endpoint.id).delete()


def webhook_endpoint_rotate_secret(
    *, endpoint: WebhookEndpoint, keep_old_secret_active_for_24_hours: object = False
) -> WebhookEndpoint:
    if not isinstance(keep_old_secret_active_for_24_hours, bool):
        raise ValidationFailed(
            "keep_old_secret_active_for_24_hours must be a boolean.", param="keep_old_secret_active_for_24_hours"
        )
    now = timezone.now()
    keep = keep_old_secret_active_for_24_hours
    WebhookEndpoint.objects.filter(id=endpoint.id).update(
        secret=secret_new(),
        previous_secret=endpoint.secret if keep else "",
        previous_secret_expires_at=now + SECRET_OVERLAP if keep else None,
        updated_at=now,
    )
    return WebhookEndpoint.objects.get(id=endpoint.id)


def signing_secrets(endpoint: WebhookEndpoint, *, now: datetime) -> list[str]:
    """The current secret, and the previous one while a rotation's overlap lasts."""
    keys = [endpoint.secret]
    if endpoint.previous_secret and endpoint.previous_secret_expires_at and endpoint.previous_secret_expires_at > now:
        keys.append(endpoint.previous_secret)
    return keys


def event_body(*, event_id: str, event_type: str, object_id: str, created_at: datetime) -> str:
    """OpenAI's event object, encoded once (the signature covers these exact bytes)."""
    body = {
        "id": event_id,
        "object": "event",
        "type": event_type,
        "created_at": int(created_at.timestamp()),
        "data": {"id": object_id},
    }
    return json.dumps(body, separators=(",", ":"))


def batch_event_emit(
    *, tenant_id: int, batch_id: str, event_type: str, created_at: datetime | None = None
) -> list[str]:
    """Record ``event_type`` for a batch that just reached a terminal state: one event, one delivery per
    enabled endpoint of the tenant that subscribed to it. Call it inside the transaction that sets the status,
    so the two commit together; it only writes rows and sends on commit, never waits on an endpoint.
    Returns the delivery ids."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"not a batch event type: {event_type!r}")
    endpoints = [
        endpoint.id
        for endpoint in WebhookEndpoint.objects.filter(tenant_id=tenant_id, enabled=True).only("id", "event_types")
        if event_type in endpoint.event_types
    ]
    if not endpoints:
        return []
    now = timezone.now()
    at = created_at or now
    event_id = new_event_id()
    event = WebhookEvent.objects.create(
        id=event_id,
        tenant_id=tenant_id,
        type=event_type,
        object_id=batch_id,
        body=event_body(event_id=event_id, event_type=event_type, object_id=batch_id, created_at=at),
        created_at=at,
    )
    window = timedelta(seconds=settings.WEBHOOK_RETRY_WINDOW_SECONDS)
    deliveries = WebhookDelivery.objects.bulk_create(
        WebhookDelivery(
            event=event,
            endpoint_id=endpoint_id,
            next_attempt_at=now,
            retry_until=now + window,
            enqueued_at=now,
            created_at=now,
        )
        for endpoint_id in endpoints
    )
    for delivery in deliveries:
        dispatch.webhook_deliver_enqueue(delivery.id)
    return [delivery.id for delivery in deliveries]


def deliveries_redeliver(*, delivery_ids: Sequence[str]) -> int:
    """Operators' redeliver: a new attempt now, with the same webhook-id, and a new retry window should it
    fail. Works on any delivery, a succeeded one included (its receiver lost it). Returns how many."""
    now = timezone.now()
    with transaction.atomic():
        ids = list(
            WebhookDelivery.objects.select_for_update().filter(id__in=list(delivery_ids)).values_list("id", flat=True)
        )
        WebhookDelivery.objects.filter(id__in=ids).update(
            status=DeliveryStatus.PENDING,
            next_attempt_at=now,
            retry_until=now + timedelta(seconds=settings.WEBHOOK_RETRY_WINDOW_SECONDS),
            enqueued_at=now,
        )
        for delivery_id in ids:
            dispatch.webhook_deliver_enqueue(delivery_id)
    return len(ids)


def webhook_endpoint_test(*, endpoint: WebhookEndpoint, event_type: object) -> Outcome:
    """Send one sample event now and wait for the answer (OpenAI's "test" call). Nothing is recorded and
    nothing retried: the caller sees the outcome.

    It runs on a web thread, so it is bounded twice: the whole call ends within WEBHOOK_TEST_TIMEOUT_SECONDS,
    and a process runs at most one test per tenant and WEBHOOK_TEST_MAX_INFLIGHT in all (more is a 429 at
    once), so a tenant's slow receiver holds at most one thread of a process, for seconds. Answering with the
    status code (OpenAI's shape, which the SDK parses) rules out queueing it and answering later."""
    if not isinstance(event_type, str) or event_type not in EVENT_TYPES:
        raise ValidationFailed(f"event_type must be one of {list(EVENT_TYPES)}.", param="event_type")
    cap_seconds = settings.WEBHOOK_TEST_TIMEOUT_SECONDS
    with _web_thread_call(endpoint.tenant_id):
        now = timezone.now()
        event_id = new_event_id()
        return post(
            url=endpoint.url,
            body=event_body(event_id=event_id, event_type=event_type, object_id="batch_test", created_at=now),
            webhook_id=new_delivery_id(),
            signing_secrets=signing_secrets(endpoint, now=now),
            deadline_seconds=cap_seconds,
            policy=UrlPolicy.configured(),
        )
