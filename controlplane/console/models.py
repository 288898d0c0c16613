"""Samples the dashboards plot (written by beat, console.samples_take). The audit log of admin actions is
core.AuditEntry (core/audit.py): every app's admin writes it."""

from __future__ import annotations

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


class AdminLoginWindow(models.Model):
    """Admin login attempts for one username, or from one client address, in one fixed window
    (console/login_throttle.py). A table for the reason tenants.ApiKeyRequestWindow is one: every web process
    shares the count, on SQLite and Postgres alike. ``key`` is a digest of the scope and the username or
    address, so the table keeps no typed-in username (a password typed in the wrong field) and no address."""

    key = models.CharField(max_length=64)
    window_start = models.DateTimeField(db_index=True)
    count = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["key", "window_start"], name="uniq_admin_login_window"),)

    def __str__(self) -> str:
        return f"{self.key[:12]}… @ {self.window_start:%H:%M}: {self.count}"
