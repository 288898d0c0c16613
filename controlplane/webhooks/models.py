"""Webhook endpoints a tenant registers, the events we send them, and each delivery's attempts.

One terminal batch state is one WebhookEvent (``evt_…``, the body's ``id``, the same for every endpoint);
each of the tenant's endpoints gets one WebhookDelivery of it, whose id (``wh_…``) is the Standard Webhooks
``webhook-id`` header, constant on every attempt, so a receiver can drop duplicates by it. Every attempt
writes a WebhookAttempt row: the delivery log the admin shows."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from controlplane.core.models import new_public_id
from controlplane.tenants.models import Tenant

# OpenAI's names for the batch events; the only ones this service emits.
EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")


def new_endpoint_id() -> str:
    return new_public_id("we_")


def new_event_id() -> str:
    return new_public_id("evt_")


def new_delivery_id() -> str:
    return new_public_id("wh_")


class WebhookEndpoint(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_endpoint_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="webhook_endpoints")
    name = models.CharField(max_length=256, blank=True, default="")
    url = models.CharField(max_length=2048)
    event_types = models.JSONField(default=list)
    # Operators pause an endpoint here (admin): no new deliveries, and open ones wait until it is enabled.
    enabled = models.BooleanField(default=True)
    # ``whsec_`` + base64 of 32 random bytes. Kept as is, unlike an API key's hash: signing needs it. The
    # tenant sees it only in the create and rotate answers; afterwards only a hint of its last characters.
    secret = models.CharField(max_length=100, editable=False)
    # After a rotation with keep_old_secret_active_for_24_hours, messages carry both signatures until then.
    previous_secret = models.CharField(max_length=100, blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = (models.Index(fields=["tenant", "created_at"]),)

    def __str__(self) -> str:
        return f"{self.id} {self.url}"


class WebhookEvent(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_event_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    type = models.CharField(max_length=64)
    # The id in the event's ``data`` (a batch id); a plain id, so this app never imports batches.
    object_id = models.CharField(max_length=64, db_index=True)
    # The exact JSON body, encoded once: every attempt to every endpoint sends (and signs) the same bytes.
    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"{self.id} {self.type} {self.object_id}"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # not attempted yet
    FAILED = "failed"  # the last attempt failed; the next one is at next_attempt_at
    SUCCEEDED = "succeeded"  # a 2xx answer
    EXHAUSTED = "exhausted"  # no 2xx within the retry window (WEBHOOK_RETRY_WINDOW_SECONDS)
    # Still open when its endpoint had more than WEBHOOK_MAX_OPEN_PER_ENDPOINT open ones (housekeeping.py).
    DROPPED = "dropped"


OPEN_STATUSES = (DeliveryStatus.PENDING, DeliveryStatus.FAILED)


class WebhookDelivery(models.Model):
    # The ``webhook-id`` header of every attempt.
    id = models.CharField(primary_key=True, max_length=40, default=new_delivery_id, editable=False)
    event = models.ForeignKey(WebhookEvent, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    # Also the fencing token: an attempt records its outcome only if no later attempt was claimed since.
    attempts = models.PositiveIntegerField(default=0)
    # When the next attempt is due (retries wait here, in the database, not as Celery countdowns). While an
    # attempt runs it is pushed past the attempt's longest run, so a worker that dies mid-attempt is retried.
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    # No attempt starts after this; a redeliver opens a new window.
    retry_until = models.DateTimeField()
    # When a deliver message was last sent: the sweep re-sends a due delivery only once this is old, so a
    # backlog on the webhooks queue is not multiplied every sweep.
    enqueued_at = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    succeeded_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        indexes = (
            models.Index(fields=["status", "next_attempt_at"]),
            models.Index(fields=["endpoint", "created_at"]),
        )

    def __str__(self) -> str:
        return self.id


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField(default=0)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    # The start of the receiver's answer, for operators debugging an endpoint.
    response_excerpt = models.TextField(blank=True, default="")

    class Meta:
        constraints = (models.UniqueConstraint(fields=["delivery", "number"], name="webhook_attempt_unique_number"),)

    def __str__(self) -> str:
        return f"{self.delivery_id} #{self.number}"
