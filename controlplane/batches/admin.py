from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.batches.models import Batch, BatchEvent, BatchStatus, Shard, ShardStatus
from controlplane.batches.priority import batch_priority_set
from controlplane.batches.results.rerun import batch_rerun_failed
from controlplane.batches.services import batch_cancel
from controlplane.batches.shards import shard_requeue
from controlplane.core.audit import AuditedAdmin
from controlplane.core.http.errors import DomainError
from controlplane.tenants.models import Priority
from controlplane.usage.selectors import batch_cost


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0
    can_delete = False
    fields = (
        "index",
        "start_line",
        "end_line",
        "status",
        "attempt",
        "content_failures",
        "lease_owner",
        "lease_expires_at",
        "completed_lines",
        "failed_lines",
        "triton_server",
        "last_error",
    )
    readonly_fields = fields
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class EventInline(admin.TabularInline):
    model = BatchEvent
    extra = 0
    can_delete = False
    fields = ("created_at", "shard_index", "kind", "message")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Batch)
class BatchAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = (
        "id",
        "tenant",
        "status",
        "priority",
        "model",
        "progress",
        "total_lines",
        "created_at",
        "expires_at",
    )
    list_filter = ("status", "priority", "endpoint", "model", "tenant")
    search_fields = ("id", "input_file_id", "tenant__name", "model")
    readonly_fields = (*(f.name for f in Batch._meta.fields), "cost")
    inlines = (ShardInline, EventInline)
    actions = ("cancel_batches", "rerun_failed_lines", "set_priority_high", "set_priority_normal", "set_priority_low")

    @admin.display(description="progress")
    def progress(self, batch: Batch) -> str:
        done = batch.completed_lines + batch.failed_lines
        pct = 100 * done / batch.total_lines if batch.total_lines else 0
        return f"{done}/{batch.total_lines} ({pct:.0f}%), {batch.failed_lines} failed"

    @admin.display(description="cost (usage ledger)")
    def cost(self, batch: Batch) -> str:
        amount = batch_cost(batch_id=batch.id)
        return f"{amount.value:.6f} {amount.currency}"

    @admin.action(description="Cancel selected batches (finished lines are kept)")
    def cancel_batches(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        cancelled = 0
        for batch in queryset:
            try:
                batch_cancel(batch=batch)
                cancelled += 1
            except DomainError as exc:
                self.message_user(request, exc.message, level=messages.WARNING)
        self.message_user(request, f"Cancelling {cancelled} batch(es).")

    @admin.action(description="Re-run failed lines as a new batch (for the same tenant)")
    def rerun_failed_lines(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        created = []
        for batch in queryset.select_related("tenant"):
            try:
                created.append(batch_rerun_failed(batch=batch, actor=request.user.get_username()).id)
            except DomainError as exc:
                self.message_user(request, exc.message, level=messages.WARNING)
        if created:
            self.message_user(request, f"Created {', '.join(created)}.")

    def _set_priority(self, request: HttpRequest, queryset: QuerySet[Batch], priority: str) -> None:
        # Operators may set any class: the tenant's max_priority limits only the API.
        actor, changed = request.user.get_username(), 0
        for batch_id in queryset.values_list("id", flat=True):
            try:
                changed += batch_priority_set(batch_id=batch_id, priority=priority, actor=actor)
            except DomainError as exc:
                self.message_user(request, exc.message, level=messages.WARNING)
        self.message_user(request, f"{changed} batch(es) moved to priority {priority}.")

    @admin.action(description="Set priority: high")
    def set_priority_high(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        self._set_priority(request, queryset, Priority.HIGH)

    @admin.action(description="Set priority: normal")
    def set_priority_normal(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        self._set_priority(request, queryset, Priority.NORMAL)

    @admin.action(description="Set priority: low")
    def set_priority_low(self, request: HttpRequest, queryset: QuerySet[Batch]) -> None:
        self._set_priority(request, queryset, Priority.LOW)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


class DeadLetterFilter(admin.SimpleListFilter):
    title = "dead letters"
    parameter_name = "dead"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("open", "dead, batch still open (requeueable)"), ("all", "all dead shards")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Shard]) -> QuerySet[Shard]:
        if self.value() == "all":
            return queryset.filter(status=ShardStatus.DEAD)
        if self.value() == "open":
            return queryset.filter(
                status=ShardStatus.DEAD, batch__status=BatchStatus.IN_PROGRESS, batch__stop_reason__isnull=True
            )
        return queryset


@admin.register(Shard)
class ShardAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = (
        "__str__",
        "status",
        "attempt",
        "content_failures",
        "error",
        "lease_owner",
        "lease_expires_at",
        "completed_lines",
        "failed_lines",
        "triton_server",
    )
    list_filter = (DeadLetterFilter, "status", "triton_server")
    search_fields = ("batch__id", "lease_owner", "last_error")
    readonly_fields = tuple(f.name for f in Shard._meta.fields)
    actions = ("requeue_dead_shards",)

    @admin.display(description="last error")
    def error(self, shard: Shard) -> str:
        return shard.last_error[:200]

    @admin.action(description="Requeue selected dead shards (only while their batch is in progress)")
    def requeue_dead_shards(self, request: HttpRequest, queryset: QuerySet[Shard]) -> None:
        actor, requeued = request.user.get_username(), 0
        for shard_id in queryset.values_list("id", flat=True):
            try:
                shard_requeue(shard_id=shard_id, actor=actor)
                requeued += 1
            except DomainError as exc:
                self.message_user(request, exc.message, level=messages.WARNING)
        self.message_user(request, f"Requeued {requeued} shard(s).")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(BatchEvent)
class BatchEventAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("created_at", "batch", "shard_index", "kind", "message")
    list_filter = ("kind",)
    search_fields = ("batch__id", "message")
