from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.core.http.errors import (
    Conflict,
    NotFound,
    QuotaExceeded,
    ValidationFailed,
    ratelimit_headers,
    whole_seconds,
)
from controlplane.core.messaging import dispatch
from controlplane.core.windows import window_increment
from controlplane.tenants.models import ApiKey, ApiKeyRequestWindow, Tenant, TenantEvent

KEY_PREFIX = "sk-cp-"
REQUEST_WINDOW = timedelta(minutes=1)


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def api_key_create(*, tenant: Tenant, name: str = "", expires_at: datetime | None = None) -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is never stored and cannot be shown again.

    ``expires_at`` None: the key works until revoked; otherwise it must lie in the future."""
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed(f"The key's expiry {expires_at.isoformat()} is not in the future.", param="expires_at")
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant,
        name=name,
        prefix=raw_key[: len(KEY_PREFIX) + 6],
        key_hash=hash_api_key(raw_key),
        expires_at=expires_at,
    )
    return key, raw_key


@transaction.atomic
def tenant_create(*, name: str, key_expires_at: datetime | None = None) -> tuple[Tenant, str]:
    if Tenant.objects.filter(name=name).exists():
        raise Conflict(f"A tenant named {name!r} already exists.", param="name")
    tenant = Tenant.objects.create(name=name)
    _, raw_key = api_key_create(tenant=tenant, name="initial", expires_at=key_expires_at)
    return tenant, raw_key


def api_key_revoke(*, key_id: int, actor: str) -> bool:
    """Revoke a key for good: it fails authentication from the next request on. Returns whether this call
    revoked it; revoking a revoked key changes nothing and records nothing.

    ``revoked_at`` is only ever set (conditional UPDATE on ``revoked_at IS NULL``, so two operators at once
    record one revocation) and never cleared: there is no un-revoke; issue a new key instead."""
    with transaction.atomic():
        key = ApiKey.objects.filter(id=key_id).first()
        if key is None:
            raise NotFound(f"No API key with id {key_id}.", param="key_id")
        changed = ApiKey.objects.filter(id=key_id, revoked_at__isnull=True).update(revoked_at=timezone.now())
        if changed:
            TenantEvent.objects.create(
                tenant_id=key.tenant_id,
                kind="key_revoked",
                actor=actor[:100],
                message=f"key {key.prefix}… ({key.name or 'unnamed'})",
            )
    return bool(changed)


def tenant_set_paused(*, tenant_id: int, paused: bool, actor: str) -> bool:
    """Pause or resume a tenant: a paused tenant's batches keep their state but no new shard of theirs is
    dispatched. Returns whether anything changed; only a change writes a TenantEvent."""
    with transaction.atomic():
        # Conditional, so a repeated click (or two operators at once) records one event, not two.
        changed = Tenant.objects.filter(id=tenant_id, paused=not paused).update(paused=paused)
        if changed:
            TenantEvent.objects.create(
                tenant_id=tenant_id,
                kind="paused" if paused else "resumed",
                actor=actor[:100],
                message="no new shards are dispatched" if paused else "dispatch resumed",
            )
            if not paused:
                dispatch.slots_topup_enqueue()  # resumed work gets slots now, not at the next beat
    return bool(changed)


@dataclass(frozen=True)
class RequestRate:
    """One key's use of its per-minute request limit, this request included."""

    limit: int
    count: int
    reset_seconds: float  # until the next window starts and the count is back to 0

    def headers(self) -> dict[str, str]:
        return ratelimit_headers(
            name="requests", limit=self.limit, remaining=self.limit - self.count, reset_seconds=self.reset_seconds
        )


def request_window_start(now: datetime) -> datetime:
    """Fixed one-minute windows aligned to the minute, so every process agrees on the window."""
    return now.replace(second=0, microsecond=0)


def api_request_record(*, api_key: ApiKey, now: datetime) -> RequestRate:
    """Count one API request for ``api_key`` in the current window; over the tenant's
    ``max_requests_per_minute`` raise QuotaExceeded (429) with Retry-After at the next window."""
    window_start = request_window_start(now)
    count = window_increment(ApiKeyRequestWindow, key_field="api_key", key=api_key.id, window_start=window_start)
    if count == 1:
        # First request of a new window: the key's earlier windows are done with. This keeps about one row
        # per key at the cost of one indexed DELETE per key per minute.
        ApiKeyRequestWindow.objects.filter(api_key_id=api_key.id, window_start__lt=window_start).delete()
    rate = RequestRate(
        limit=api_key.tenant.max_requests_per_minute,
        count=count,
        reset_seconds=(window_start + REQUEST_WINDOW - now).total_seconds(),
    )
    if rate.count > rate.limit:
        raise QuotaExceeded(
            f"Rate limit reached for requests per minute on this API key: limit {rate.limit}, used "
            f"{rate.count - 1}, requested 1. Try again in {whole_seconds(rate.reset_seconds)}s.",
            code="rate_limit_exceeded",
            limit="max_requests_per_minute",
            value=rate.limit,
            current=rate.count - 1,
            requested=1,
            retry_after=rate.reset_seconds,
            header_name="requests",
        )
    return rate
