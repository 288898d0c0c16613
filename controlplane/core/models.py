"""Shared model helpers."""

from __future__ import annotations

import secrets
from typing import ClassVar

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
    """The stored answer to one ``Idempotency-Key`` of a tenant (controlplane/core/http/idempotency.py).

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
    (core.outbox_relay, on beat) sends it later (controlplane/core/messaging/dispatch.py). Receivers are
    idempotent, so the rare double send (sent, then the delete failed) is harmless."""

    task_name = models.CharField(max_length=100)
    args = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"{self.task_name}{self.args}"


class AuditEntry(models.Model):
    """One admin action: add, change, delete, or a list action, with who did it to what.

    Kept apart from Django's LogEntry (which the admin still writes for its per-object history) because an
    audit record must outlive its actor and name what LogEntry cannot: LogEntry rows are deleted with their
    user (a CASCADE foreign key), carry only three action flags and one object each, and have no place for
    a list action's name, its selection or its outcome."""

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.CharField(max_length=150, help_text="Username at the time of the action")
    actor_id = models.BigIntegerField(null=True, blank=True)
    # "add", "change", "delete", or the name of the list action (e.g. "cancel_batches").
    action = models.CharField(max_length=100, db_index=True)
    app_label = models.CharField(max_length=100)
    model = models.CharField(max_length=100)
    object_id = models.CharField(max_length=255, blank=True, default="", help_text="First of the objects")
    object_repr = models.CharField(max_length=500, blank=True, default="")
    # The change message, or a list action's description, selected ids, count and outcome.
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["-created_at", "-id"]
        verbose_name_plural = "audit entries"
        # Created by the console app and moved here with its rows (migration core 0003): the table keeps its name.
        db_table = "console_auditentry"
        # A list as in the migration (django-stubs types the option more widely than ClassVar can say here).
        permissions = [  # noqa: RUF012
            ("run_admin_actions", "Can run the admin's list actions (requeue, cancel, drain, …)"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.app_label}.{self.model} {self.object_id}"


class BeatRun(models.Model):
    """When a beat job last started (controlplane/core/messaging/beat.py): a message of the job sent before that start is
    superseded by it and skipped, so a backlog of beat messages costs one run per job, never none."""

    name = models.CharField(max_length=200, primary_key=True)  # the task's name
    started_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} started {self.started_at.isoformat()}"
