"""Samples the dashboards plot (written by beat, console.samples_take) and the audit log of admin actions."""

from __future__ import annotations

from typing import ClassVar

from django.db import models


class ModelSample(models.Model):
    """One catalogue model at one tick: its queue, what finished since the previous tick, its capacity.

    ``epoch`` repeats ``taken_at`` in whole seconds so the dashboards can bucket by integer division in the
    database, the same SQL on Postgres and SQLite."""

    taken_at = models.DateTimeField()
    epoch = models.BigIntegerField(db_index=True)
    # The tick covers (previous tick, taken_at]: rates are lines ÷ interval_seconds.
    interval_seconds = models.FloatField()
    model = models.CharField(max_length=200)
    runnable_shards = models.PositiveIntegerField(default=0)
    runnable_lines = models.PositiveBigIntegerField(default=0)
    running_shards = models.PositiveIntegerField(default=0)
    lines_completed = models.PositiveBigIntegerField(default=0)
    lines_failed = models.PositiveBigIntegerField(default=0)
    shards_finished = models.PositiveIntegerField(default=0)
    # Seconds from claim to commit of the shards finished in the interval; null when none finished.
    shard_p50_seconds = models.FloatField(null=True, blank=True)
    shard_p95_seconds = models.FloatField(null=True, blank=True)
    shard_p99_seconds = models.FloatField(null=True, blank=True)
    # Capacity: ready instances placed for the model, and dispatch slots (one shard each) used of the cap
    # those instances give (scheduling.selectors.model_slot_cap).
    instances = models.PositiveIntegerField(default=0)
    slot_cap = models.PositiveIntegerField(default=0)
    slots_running = models.PositiveIntegerField(default=0)

    class Meta:
        indexes = (models.Index(fields=["model", "epoch"]),)

    def __str__(self) -> str:
        return f"{self.model} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"


class ServerSample(models.Model):
    """One Triton server at one tick: instances placed on it and, where Triton exports it, GPU utilisation."""

    taken_at = models.DateTimeField()
    epoch = models.BigIntegerField(db_index=True)
    server = models.CharField(max_length=100)
    instances = models.PositiveIntegerField(default=0)
    running_shards = models.PositiveIntegerField(default=0)
    # Mean of the server's GPUs' nv_gpu_utilization (0–1) from the fleet heartbeat; null on declared GPUs.
    gpu_utilization = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.server} @ {self.taken_at:%Y-%m-%d %H:%M:%S}"


class Dashboard(ModelSample):
    """No table: the admin's dashboards page hangs off this proxy, so it is listed on the admin index and has
    a view permission of its own (roles.py gives it to every role)."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboards"


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
        # A list as in the migration (django-stubs types the option more widely than ClassVar can say here).
        permissions = [  # noqa: RUF012
            ("run_admin_actions", "Can run the admin's list actions (requeue, cancel, drain, …)"),
        ]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.app_label}.{self.model} {self.object_id}"
