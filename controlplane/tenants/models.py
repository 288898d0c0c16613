from __future__ import annotations

from django.db import models

from controlplane.core.models import TimestampedModel


class Tenant(TimestampedModel):
    name = models.CharField(max_length=200, unique=True)
    is_active = models.BooleanField(default=True)
    # Quotas: over quota is a 429 with a clear body, never a silent queue.
    max_concurrent_batches = models.PositiveIntegerField(default=100)
    max_enqueued_lines = models.PositiveBigIntegerField(default=50_000_000)

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
