from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from controlplane.core.models import TimestampedModel


class Priority(models.TextChoices):
    """Batch priority classes, strictly ordered (controlplane/scheduling/policy.py)."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


# Lower rank is served first.
PRIORITY_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}


def priority_parse(value: object) -> Priority | None:
    """The priority class named by ``value``, or None when ``value`` is not one."""
    if not isinstance(value, str):
        return None
    try:
        return Priority(value)
    except ValueError:
        return None


def priority_rank(value: object) -> int | None:
    """The rank of a priority class name, or None when ``value`` is not one."""
    priority = priority_parse(value)
    return None if priority is None else PRIORITY_RANK[priority]


def default_storage_quota_bytes() -> int | None:
    """The service's storage quota for a tenant without its own: TENANT_STORAGE_QUOTA_BYTES (0: unlimited, None).
    Also named by migration 0005, when it was the field's default."""
    return settings.TENANT_STORAGE_QUOTA_BYTES or None


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
    # Bytes of stored files (uploads and batch results) and of the results of running batches (files/quota.py);
    # an upload over it is a 413 (the file alone) or 429. Empty follows TENANT_STORAGE_QUOTA_BYTES, so a tenant
    # nobody configured still has the service's limit (and follows it when the operator changes it).
    storage_quota_bytes = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        default=None,
        help_text="Bytes of stored files and expected results of running batches. Empty: the service default "
        "(TENANT_STORAGE_QUOTA_BYTES).",
    )
    # Scheduling: share of the fleet relative to other tenants, and the priority classes allowed.
    weight = models.FloatField(default=1.0, help_text="Fair-share weight: 2.0 gets twice the work of 1.0")
    max_priority = models.CharField(
        max_length=8,
        choices=Priority.choices,
        default=Priority.NORMAL,
        help_text="Highest priority class this tenant may ask for.",
    )
    default_priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    # A paused tenant's batches stay in_progress but no new shard of theirs is dispatched.
    paused = models.BooleanField(default=False)
    # Checked at batch create against the usage ledger's month-to-date cost, and on beat while batches run
    # (controlplane/usage/spendcap.py).
    monthly_spend_cap = models.DecimalField(
        max_digits=14,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="USD per calendar month (UTC); once reached, new batches are refused and running ones stop. "
        "Empty: no cap.",
    )
    # Set while the month-to-date cost is at or over the cap (usage/spendcap.spend_caps_refresh, on beat): the
    # scheduler's claim reads this column instead of summing the ledger on every claim.
    spend_capped_at = models.DateTimeField(
        null=True, blank=True, help_text="When the tenant reached its spend cap this month; empty: under it."
    )

    def __str__(self) -> str:
        return self.name

    @property
    def storage_quota(self) -> int | None:
        """The quota in force: this tenant's own, else the service default; None is unlimited."""
        own = self.storage_quota_bytes
        return own if own is not None else default_storage_quota_bytes()

    def clean(self) -> None:
        if self.weight is not None and not self.weight > 0:
            # Shares are proportional to weight: 0 would starve the tenant, a negative one is meaningless.
            raise ValidationError({"weight": "Weight must be above 0; pause the tenant to stop its work."})
        # A default above the allowed maximum would turn every request without a priority into a 400.
        default_rank, max_rank = priority_rank(self.default_priority), priority_rank(self.max_priority)
        if default_rank is not None and max_rank is not None and default_rank < max_rank:
            raise ValidationError(
                {"default_priority": f"The default priority cannot be above the maximum, {self.max_priority!r}."}
            )


class ApiKey(TimestampedModel):
    """An API key. Only its SHA-256 is stored: keys carry 256 random bits, so no salt/KDF is needed."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, help_text="First characters of the key, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Set once by api_key_revoke and never cleared: a revoked key stays revoked (read-only in the admin).
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: the key never expires.")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant.name})"

    def unusable_reason(self, now: datetime) -> str | None:
        """Why this key cannot authenticate at ``now`` (revoked, expired), or None when it can."""
        if self.revoked_at is not None:
            return f"This API key ({self.prefix}…) was revoked at {self.revoked_at.isoformat()}."
        if self.expires_at is not None and self.expires_at <= now:
            return f"This API key ({self.prefix}…) expired at {self.expires_at.isoformat()}."
        return None


class TenantEvent(models.Model):
    """Audit trail of operator changes to a tenant (pause, resume), shown in the admin."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32)
    actor = models.CharField(max_length=100)
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        # A list as in the migrations: a tuple would read as a changed option to makemigrations.
        ordering: ClassVar[list[str]] = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.kind} by {self.actor}"


class ApiKeyRequestWindow(models.Model):
    """Requests made with one API key in one fixed one-minute window (the per-key request rate).

    A table rather than the cache: the embedded default has no shared cache (LocMem is per gunicorn
    process, so N workers would allow N × the limit), and the one database every process already uses
    gives an exact count with a single upsert, on SQLite and Postgres alike. Old windows are pruned as
    each key opens a new one, so the table holds about one row per active key.
    """

    # No index of its own: the unique (api_key, window_start) index serves lookups by key.
    api_key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="request_windows", db_index=False)
    window_start = models.DateTimeField()
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["api_key", "window_start"], name="uniq_api_key_request_window"),)

    def __str__(self) -> str:
        return f"key {self.api_key_id} @ {self.window_start:%H:%M}: {self.count}"
