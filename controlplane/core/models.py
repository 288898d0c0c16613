"""Shared model helpers."""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone


def new_public_id(prefix: str) -> str:
    """OpenAI-style opaque ids (``file-…``, ``batch_…``): random, so ids reveal nothing across tenants."""
    return f"{prefix}{secrets.token_hex(12)}"


class TimestampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class IdempotencyRecord(models.Model):
    """The stored answer to one ``Idempotency-Key`` of a tenant (controlplane/core/idempotency.py).

    The tenant is named by string, not imported: core stays the lowest app in Python, only its migration
    depends on tenants. A row exists only committed together with the object its request created."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    # sha256 of method, path and body: the same key with another request is a 409, not a replay.
    request_hash = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.JSONField(null=True)
    # A plain default (not auto_now_add): tests and the pruner compare it with a clock they choose.
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["tenant", "key"], name="idempotency_unique_tenant_key"),)

    def __str__(self) -> str:
        return f"{self.tenant_id}:{self.key}"


class OutboxMessage(models.Model):
    """A broker message that must not be lost: written in the transaction that makes it necessary, sent
    after commit, deleted once the broker took it. If the broker is down the row stays and the relay
    (core.outbox_relay, on beat) sends it later (controlplane/core/dispatch.py). Receivers are
    idempotent, so the rare double send (sent, then the delete failed) is harmless."""

    task_name = models.CharField(max_length=100)
    args = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"{self.task_name}{self.args}"
