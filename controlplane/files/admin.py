from __future__ import annotations

from django.contrib import admin

from controlplane.core.audit import AuditedAdmin
from controlplane.files.models import File


@admin.register(File)
class FileAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = ("id", "tenant", "filename", "purpose", "bytes", "created_at", "expires_at")
    list_filter = ("purpose", "tenant")
    search_fields = ("id", "filename", "tenant__name")
    readonly_fields = ("id", "tenant", "filename", "purpose", "bytes", "storage_name", "created_at", "expires_at")
