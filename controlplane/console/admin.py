"""The console in the admin: the dashboards page (charts of stored samples over a chosen window) and the
audit log, read-only for everyone, superusers included: an audit trail nobody can edit from the admin."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.safestring import mark_safe

from controlplane.console import svg
from controlplane.console.models import Dashboard
from controlplane.console.selectors import DEFAULT_WINDOW, WINDOWS, dashboard
from controlplane.core.audit import AuditedAdmin, ReadOnlyAdmin
from controlplane.core.models import AuditEntry

# Users and their groups (roles) are the most sensitive changes of all: Django's own admins, audited.
admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class AuditedUserAdmin(AuditedAdmin, UserAdmin):  # type: ignore[type-arg]
    pass


@admin.register(Group)
class AuditedGroupAdmin(AuditedAdmin, GroupAdmin):
    pass


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "actor", "action", "app_label", "model", "object_id", "object_repr")
    list_filter = ("action", "app_label", "model", "actor")
    search_fields = ("actor", "object_id", "object_repr", "action")
    date_hierarchy = "created_at"
    readonly_fields = ("created_at", "actor", "actor_id", "action", "app_label", "model", "object_id", "object_repr")
    fields = (*readonly_fields, "details")


def _time_label(bucket_seconds: int) -> svg.Formatter:
    fmt = "%H:%M" if bucket_seconds < 600 else "%m-%d %H:%M"  # the date matters once the window spans days

    def label(x: float) -> str:
        return datetime.fromtimestamp(x, UTC).strftime(fmt)

    return label


@admin.register(Dashboard)
class DashboardAdmin(ReadOnlyAdmin):
    """The list page of the Dashboard proxy is the dashboards page itself (linked from the admin index)."""

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        window = request.GET.get("window", DEFAULT_WINDOW)
        if window not in WINDOWS:
            window = DEFAULT_WINDOW  # an unknown value shows the default rather than an error page
        data = dashboard(window=window, now=timezone.now())
        x = _time_label(data.bucket_seconds)

        def pct(v: float) -> str:
            return f"{v:.0f} %"

        def secs(v: float) -> str:
            return f"{v:.3g} s"

        charts = [
            (
                "queue",
                svg.line_chart(data.queue_lines, title="Queue depth: runnable lines", y_label="lines", x_format=x),
            ),
            (
                "throughput",
                svg.line_chart(
                    data.throughput, title="Lines per second (done + failed)", y_label="lines/s", x_format=x
                ),
            ),
            *(
                (
                    f"latency-{i}",
                    svg.line_chart(
                        series,
                        title=f"Shard duration percentiles: {model}",
                        y_label="seconds",
                        x_format=x,
                        y_format=secs,
                    ),
                )
                for i, (model, series) in enumerate(sorted(data.latency.items()))
            ),
            (
                "cost",
                svg.bar_chart(
                    data.cost,
                    title=f"Cost per tenant per day ({data.cost_currency or 'no charges'})",
                    y_label=data.cost_currency or "cost",
                ),
            ),
            (
                "slots",
                svg.line_chart(
                    data.slot_utilisation,
                    title="Utilisation: dispatch slots running ÷ slot cap",
                    y_label="%",
                    x_format=x,
                    y_format=pct,
                ),
            ),
            (
                "instances",
                svg.line_chart(
                    data.instances, title="Instances placed (ready) per model", y_label="instances", x_format=x
                ),
            ),
        ]
        if data.gpu_utilisation:
            charts.append(
                (
                    "gpu",
                    svg.line_chart(
                        data.gpu_utilisation,
                        title="GPU utilisation per server (Triton nv_gpu_utilization)",
                        y_label="%",
                        x_format=x,
                        y_format=pct,
                    ),
                )
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Dashboards",
            "opts": self.opts,
            "data": data,
            "windows": list(WINDOWS),
            "charts": [(name, mark_safe(chart)) for name, chart in charts],  # svg.py escapes every text it writes
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/console/dashboard.html", context)
