from __future__ import annotations

from django.contrib import admin
from django.db.models import QuerySet, Sum
from django.http import HttpRequest

from controlplane.core.audit import AuditedAdmin
from controlplane.tenants.models import ApiKey, Tenant, TenantEvent
from controlplane.tenants.services import api_key_revoke, tenant_set_paused


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at")
    # revoked_at is set only by the revoke action (api_key_revoke): never cleared by editing a field.
    readonly_fields = ("prefix", "created_at", "last_used_at", "revoked_at")
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False  # keys come from the service, which shows the secret once (see ApiKeyAdmin)


class TenantEventInline(admin.TabularInline):
    model = TenantEvent
    extra = 0
    max_num = 0
    fields = readonly_fields = ("created_at", "kind", "actor", "message")
    can_delete = False
    verbose_name_plural = "history"


@admin.register(Tenant)
class TenantAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = (
        "name",
        "is_active",
        "paused",
        "weight",
        "max_priority",
        "default_priority",
        "max_concurrent_batches",
        "max_enqueued_lines",
        "max_requests_per_minute",
        "created_at",
    )
    # Plain settings are edited in place (the admin's log records who changed what); pausing goes through
    # the actions, which write a TenantEvent.
    list_editable = ("weight", "max_priority", "default_priority")
    list_filter = ("is_active", "paused", "max_priority")
    search_fields = ("name",)
    readonly_fields = ("paused", "created_at", "updated_at", "storage_used_bytes", "spend_capped_at")
    fieldsets = (
        (None, {"fields": ("name", "is_active", "created_at", "updated_at")}),
        (
            "Quotas (over a quota is a 429)",
            {
                "fields": (
                    "max_concurrent_batches",
                    "max_enqueued_lines",
                    "max_enqueued_tokens",
                    "max_requests_per_minute",
                    "storage_quota_bytes",
                    "storage_used_bytes",
                    "monthly_spend_cap",
                    "spend_capped_at",
                )
            },
        ),
        (
            "Scheduling (pause and resume with the actions on the list page)",
            {
                "fields": (
                    "weight",
                    "max_priority",
                    "default_priority",
                    "paused",
                )
            },
        ),
    )
    inlines = (ApiKeyInline, TenantEventInline)
    actions = ("pause", "resume")

    @admin.display(description="Storage used (bytes)")
    def storage_used_bytes(self, obj: Tenant) -> str:
        # Through the reverse relations: the tenants app does not import the files app above it.
        if not obj.pk:
            return "0"
        stored = int(obj.files.aggregate(total=Sum("bytes"))["total"] or 0)
        reserved = int(obj.storage_reservations.aggregate(total=Sum("bytes"))["total"] or 0)
        quota = obj.storage_quota
        limit = (
            "unlimited"
            if quota is None
            else f"{quota}" + (" (service default)" if obj.storage_quota_bytes is None else "")
        )
        return f"{stored} stored + {reserved} reserved for running batches, of {limit}"

    def _set_paused(self, request: HttpRequest, queryset: QuerySet[Tenant], *, paused: bool) -> None:
        actor = request.user.get_username()
        changed = [
            tenant.name
            for tenant in queryset.order_by("name")
            if tenant_set_paused(tenant_id=tenant.id, paused=paused, actor=actor)
        ]
        verb = "Paused" if paused else "Resumed"
        self.message_user(request, f"{verb}: {', '.join(changed)}." if changed else f"{verb}: nothing to change.")

    @admin.action(description="Pause: dispatch no new shards of the selected tenants")
    def pause(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(description="Resume dispatching the selected tenants' shards")
    def resume(self, request: HttpRequest, queryset: QuerySet[Tenant]) -> None:
        self._set_paused(request, queryset, paused=False)


@admin.register(ApiKey)
class ApiKeyAdmin(AuditedAdmin, admin.ModelAdmin):
    # The hash is not a secret but is useless to an operator; the key itself is never stored.
    list_display = ("prefix", "tenant", "name", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = ("revoked_at", "expires_at")
    search_fields = ("prefix", "tenant__name", "name")
    fields = ("tenant", "name", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at")
    # revoked_at is read-only: a revoked key cannot be brought back by editing the field, only by the
    # revoke action setting it (api_key_revoke, which also writes a TenantEvent).
    readonly_fields = ("tenant", "prefix", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        # Keys are created with `manage.py tenant_create` / `api_key_create` (the service), which shows the
        # secret once.
        return False

    @admin.action(description="Revoke the selected keys (for good: they stop working at once)")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        actor = request.user.get_username()
        revoked = [key.prefix for key in queryset.order_by("id") if api_key_revoke(key_id=key.id, actor=actor)]
        self.message_user(
            request, f"Revoked: {', '.join(p + '…' for p in revoked)}." if revoked else "Revoked: nothing to change."
        )
