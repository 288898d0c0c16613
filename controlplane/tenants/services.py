from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from controlplane.core.errors import Conflict
from controlplane.tenants.models import ApiKey, Tenant

KEY_PREFIX = "sk-cp-"


def hash_api_key(raw_key: str) -> str:
    return hashlib.sha256(raw_key.encode()).hexdigest()


@transaction.atomic
def api_key_create(*, tenant: Tenant, name: str = "") -> tuple[ApiKey, str]:
    """Create a key and return it with its secret, which is never stored and cannot be shown again."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=raw_key[: len(KEY_PREFIX) + 6], key_hash=hash_api_key(raw_key)
    )
    return key, raw_key


@transaction.atomic
def tenant_create(*, name: str) -> tuple[Tenant, str]:
    if Tenant.objects.filter(name=name).exists():
        raise Conflict(f"A tenant named {name!r} already exists.", param="name")
    tenant = Tenant.objects.create(name=name)
    _, raw_key = api_key_create(tenant=tenant, name="initial")
    return tenant, raw_key


def api_key_revoke(*, key: ApiKey) -> None:
    ApiKey.objects.filter(id=key.id, revoked_at__isnull=True).update(revoked_at=timezone.now())
