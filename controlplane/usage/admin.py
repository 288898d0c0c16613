"""Prices (editable, effective-dated), the ledger (read-only) and the operators' daily view: cost per
tenant and model per day, and idle capacity (instance-seconds not attributed to any tenant)."""

from __future__ import annotations

import datetime
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils import timezone

from controlplane.core.audit import AuditedAdmin
from controlplane.usage.models import CapacityInterval, Price, UsageRecord
from controlplane.usage.selectors import cost_by_tenant_per_day, idle_capacity_per_day

# How far back the daily view looks by default (?days=N changes it, up to a year).
DAILY_VIEW_DAYS = 14


@admin.register(Price)
class PriceAdmin(AuditedAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        *("model", "effective_from", "per_million_tokens", "per_million_cached_tokens", "per_million_output_tokens"),
        *("per_thousand_rows", "per_gpu_second", "currency"),
    )
    list_filter = ("model", "currency")
    date_hierarchy = "effective_from"


@admin.register(UsageRecord)
class UsageRecordAdmin(AuditedAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "finished_at",
        "tenant",
        "model",
        "batch_id",
        "completed_lines",
        "failed_lines",
        "tokens",
        "cached_tokens",
        "output_tokens",
        "rows",
        "compute_seconds",
        "compute_source",
        "cost",
        "currency",
    )
    list_filter = ("tenant", "model", "compute_source", "server")
    search_fields = ("batch_id", "tenant__name", "model")
    date_hierarchy = "finished_at"
    readonly_fields = tuple(f.name for f in UsageRecord._meta.fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # what was charged is never edited; prices change for later rows only

    def get_urls(self) -> list[URLPattern]:
        daily = path("daily/", self.admin_site.admin_view(self.daily_view), name="usage_usagerecord_daily")
        return [daily, *super().get_urls()]

    def daily_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            days = min(max(int(request.GET.get("days", DAILY_VIEW_DAYS)), 1), 366)
        except ValueError:
            days = DAILY_VIEW_DAYS
        end = timezone.now().date() + datetime.timedelta(days=1)
        start = end - datetime.timedelta(days=days)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Cost and idle capacity, last {days} days (UTC)",
            "opts": self.model._meta,
            "costs": cost_by_tenant_per_day(start=start, end=end),
            "idle": idle_capacity_per_day(start=start, end=end),
        }
        return TemplateResponse(request, "admin/usage/daily.html", context)


@admin.register(CapacityInterval)
class CapacityIntervalAdmin(AuditedAdmin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "ended_at",
        "server",
        "triton_model",
        "instances",
        "instance_seconds",
        "busy_seconds",
        "attributed_seconds",
        "records",
    )
    list_filter = ("server", "triton_model")
    date_hierarchy = "ended_at"
    readonly_fields = tuple(f.name for f in CapacityInterval._meta.fields)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
