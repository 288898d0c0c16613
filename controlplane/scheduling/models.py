"""Scheduler state: per-tenant virtual time (fair share), the system virtual time, and dispatch slots.

Postgres is the queue: shard rows say what is runnable. Celery only delivers *slots*: a slot is a
permission to run one shard of a model, and the number of slots per model is capped by the model's
Triton calls in flight. A slot row exists from enqueue until its task finishes, so the dispatcher can
count queued + running slots without asking the broker."""

from __future__ import annotations

from django.db import models

from controlplane.fleet.models import CatalogueModel
from controlplane.tenants.models import Tenant


class TenantShare(models.Model):
    """A tenant's virtual time: served work units ÷ weight, decayed (policy.py has the rule)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, primary_key=True, related_name="share")
    vtime = models.FloatField(default=0.0)
    vtime_at = models.DateTimeField()
    served_work_units = models.FloatField(default=0.0, help_text="Undecayed total, for the admin")

    def __str__(self) -> str:
        return f"share of tenant {self.tenant_id}"


class SchedulerClock(models.Model):
    """The system virtual time: where a newly backlogged tenant starts, so idle time banks no credit."""

    name = models.CharField(max_length=32, primary_key=True, default="default")
    vtime = models.FloatField(default=0.0)
    vtime_at = models.DateTimeField()


class SlotState(models.TextChoices):
    QUEUED = "queued"  # a message is on the broker
    RUNNING = "running"  # a worker took the message and is claiming/running shards


class Slot(models.Model):
    model = models.ForeignKey(CatalogueModel, on_delete=models.CASCADE, related_name="slots")
    state = models.CharField(max_length=8, choices=SlotState.choices, default=SlotState.QUEUED)
    owner = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # Queued: a lost message stops counting against the cap after this. Running: the slot's lease,
    # renewed with each shard it runs; a killed worker's slot is freed after it.
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        indexes = (models.Index(fields=["model", "state"]),)

    def __str__(self) -> str:
        return f"slot {self.id} of {self.model_id} ({self.state})"
