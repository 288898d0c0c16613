from __future__ import annotations

from django.contrib import admin

from controlplane.core.audit import AuditedAdmin, ReadOnlyAdmin
from controlplane.core.models import BeatRun, OutboxMessage


@admin.register(OutboxMessage)
class OutboxMessageAdmin(AuditedAdmin, admin.ModelAdmin):
    """Messages the broker has not taken yet: rows older than a few seconds mean the broker is down
    (last_error says what it answered). Read-only; the relay sends them once it is back."""

    list_display = ("id", "task_name", "args", "created_at", "attempts", "last_error")
    readonly_fields = list_display
    ordering = ("id",)

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


@admin.register(BeatRun)
class BeatRunAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    """When each beat job last started (core/messaging/beat.py): a start minutes older than the job's interval means the
    control workers are far behind, or beat or every control worker is down."""

    list_display = ("name", "started_at")
    readonly_fields = list_display
    ordering = ("name",)
