from __future__ import annotations

from django.db import models

from controlplane.core.models import TimestampedModel


class Priority(models.TextChoices):
    """Batch priority classes, strictly ordered (controlplane/scheduling/policy.py)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


# Lower rank is served first.
PRIORITY_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}


class Tenant(TimestampedModel):
    name = models.CharField(max_length=200, unique=True)
    is_active = models.BooleanField(default=True)
    # Quotas: over quota is a 429 with a clear body, never a silent queue.
    max_concurrent_batches = models.PositiveIntegerField(default=100)
    max_enqueued_lines = models.PositiveBigIntegerField(default=50_000_000)
    # Estimated tokens across non-terminal batches; checked at validation (token_limit_exceeded).
    max_enqueued_tokens = models.PositiveBigIntegerField(default=5_000_000_000)
    # API requests per minute, counted per key.
    max_requests_per_minute = models.PositiveIntegerField(default=3000)
    # Scheduling: share of the fleet relative to other tenants, and the priority classes allowed.
    weight = models.FloatField(default=1.0, help_text="Fair-share weight: 2.0 gets twice the work of 1.0")
    max_priority = models.CharField(
        max_length=8, choices=Priority.choices, default=Priority.NORMAL,
        help_text="Highest priority class this tenant may ask for.",
    )
    default_priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    # A paused tenant's batches stay in_progress but no new shard of theirs is dispatched.
    paused = models.BooleanField(default=False)

    def __str__(self) -> str:
        return self.name


class ApiKey(TimestampedModel):
    """An API key. Only its SHA-256 is stored: keys carry 256 random bits, so no salt/KDF is needed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, help_text="First characters of the key, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant.name})"
