from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.batches.models import Batch, BatchEvent, Shard
from controlplane.batches.services import batch_cancel
from controlplane.core.errors import DomainError


class ShardInline(admin.TabularInline):
    model = Shard
    extra = 0
    can_delete = False
    fields = ("index", "start_line", "end_line", "status", "attempt", "lease_owner", "lease_expires_at",
              "completed_lines", "failed_lines", "triton_server")
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
class BatchAdmin(admin.ModelAdmin):
    list_display = ("id", "tenant", "status", "model", "progress", "total_lines", "created_at", "expires_at")
    list_filter = ("status", "endpoint", "model", "tenant")
    search_fields = ("id", "input_file_id", "tenant__name", "model")
    readonly_fields = [f.name for f in Batch._meta.fields]
    inlines = [ShardInline, EventInline]
    actions = ["cancel_batches"]

    @admin.display(description="progress")
    def progress(self, batch: Batch) -> str:
        done = batch.completed_lines + batch.failed_lines
        pct = 100 * done / batch.total_lines if batch.total_lines else 0
        return f"{done}/{batch.total_lines} ({pct:.0f}%), {batch.failed_lines} failed"

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

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Shard)
class ShardAdmin(admin.ModelAdmin):
    list_display = ("__str__", "status", "attempt", "lease_owner", "lease_expires_at", "completed_lines",
                    "failed_lines", "triton_server")
    list_filter = ("status", "triton_server")
    search_fields = ("batch__id", "lease_owner")
    readonly_fields = [f.name for f in Shard._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(BatchEvent)
class BatchEventAdmin(admin.ModelAdmin):
    list_display = ("created_at", "batch", "shard_index", "kind", "message")
    list_filter = ("kind",)
    search_fields = ("batch__id", "message")
