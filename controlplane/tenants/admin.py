from __future__ import annotations

from django.contrib import admin

from controlplane.tenants.models import ApiKey, Tenant


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("prefix", "created_at", "last_used_at")
    can_delete = False


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "is_active", "max_concurrent_batches", "max_enqueued_lines", "created_at")
    list_filter = ("is_active",)
    search_fields = ("name",)
    inlines = [ApiKeyInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    # The hash is not a secret but is useless to an operator; the key itself is never stored.
    list_display = ("prefix", "tenant", "name", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("prefix", "tenant__name", "name")
    fields = ("tenant", "name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("tenant", "prefix", "created_at", "last_used_at")

    def has_add_permission(self, request: object) -> bool:
        # Keys are created with `manage.py tenant_create` / the service, which shows the secret once.
        return False
