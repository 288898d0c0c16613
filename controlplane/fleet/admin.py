"""Operator side of the fleet: the catalogue with its placement profile, servers and their GPUs (drain,
cordon, rebalance), placements and their history, and the fleet overview page."""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import URLPattern, path

from controlplane.core.audit import AuditedAdmin, ReadOnlyAdmin
from controlplane.core.messaging import dispatch
from controlplane.fleet.membership.inventory import server_set_operator_state
from controlplane.fleet.models import (
    ADAPTER_SEPARATOR,
    CatalogueAdapter,
    CatalogueModel,
    FleetSizePlan,
    Gpu,
    ModelKind,
    Placement,
    PlacementEvent,
    ServerState,
    TritonServer,
)
from controlplane.fleet.placement import types as pt
from controlplane.fleet.selectors import fleet_overview
from controlplane.fleet.services import model_set_paused

logger = logging.getLogger(__name__)


class CatalogueModelForm(forms.ModelForm):
    class Meta:
        model = CatalogueModel
        fields = "__all__"

    def clean_pin_gpus(self) -> list[int]:
        value = self.cleaned_data.get("pin_gpus")
        if value in (None, ""):
            return []  # a cleared field means "any GPU"; the column is NOT NULL
        if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValidationError("Enter a JSON list of GPU indices, e.g. [0, 1], or [] for any GPU.")
        if any(v < 0 for v in value) or len(set(value)) != len(value):
            raise ValidationError("GPU indices must be distinct and non-negative.")
        return sorted(value)

    def clean_name(self) -> str:
        name = self.cleaned_data.get("name") or ""
        if ADAPTER_SEPARATOR in name:  # `base:adapter` names an adapter (CatalogueAdapter)
            raise ValidationError(f"A model name cannot contain {ADAPTER_SEPARATOR!r}: it separates a LoRA adapter.")
        return name

    def clean_inputs(self) -> Any:
        return self.cleaned_data.get("inputs") or []

    def clean_outputs(self) -> Any:
        return self.cleaned_data.get("outputs") or []

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        needed = (
            "memory_per_instance_bytes",
            "load_seconds",
            "gpus_per_instance",
            "min_instances",
            "max_instances",
            "pin_gpus",
        )
        if all(cleaned.get(name) is not None for name in needed):
            # The planner's own validation: a profile it would refuse must not reach the reconciler.
            pin_server = cleaned.get("pin_server")
            try:
                pt.ModelProfile(
                    model=cleaned.get("triton_name") or "model",
                    memory_per_instance_bytes=cleaned["memory_per_instance_bytes"],
                    load_time_s=cleaned["load_seconds"],
                    gpus_per_instance=cleaned["gpus_per_instance"],
                    min_instances=cleaned["min_instances"],
                    max_instances=cleaned["max_instances"],
                    pin_server=pin_server.name if pin_server else None,
                    pin_gpus=tuple(cleaned["pin_gpus"]),
                )
            except ValueError as exc:
                raise ValidationError(f"Placement profile: {exc}") from exc
        return cleaned


@admin.register(CatalogueModel)
class CatalogueModelAdmin(AuditedAdmin, admin.ModelAdmin):
    form = CatalogueModelForm
    list_display = (
        "name",
        "triton_name",
        "kind",
        "max_batch_size",
        "embedding_dimensions",
        "is_enabled",
        "paused",
        "min_instances",
        "max_instances",
        "placed_instances",
        "last_active_at",
    )
    list_filter = ("kind", "is_enabled", "paused")
    search_fields = ("name", "triton_name")
    readonly_fields = (
        "seconds_per_work_unit",
        "model_seconds_per_work_unit",
        "last_active_at",
        "expected_completion_tokens",
    )
    # Pausing goes through the actions (fleet.services.model_set_paused): they write a PlacementEvent and top up slots.
    actions = ("pause_dispatch", "resume_dispatch")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "name",
                    "triton_name",
                    "kind",
                    "max_batch_size",
                    "call_rows",
                    "embedding_dimensions",
                    "is_enabled",
                    "inputs",
                    "outputs",
                )
            },
        ),
        (
            "Placement",
            {
                "description": "Read by the planner on every reconcile. Memory is per instance on each of its GPUs.",
                "fields": (
                    "min_instances",
                    "max_instances",
                    "pin_server",
                    "pin_gpus",
                    "memory_per_instance_bytes",
                    "load_seconds",
                    "gpus_per_instance",
                    "seconds_per_work_unit",
                    "model_seconds_per_work_unit",
                    "last_active_at",
                    "pool",
                ),
            },
        ),
        (
            "Generation",
            {
                "description": "Text generation models only (kind generation): the tokenizer and chat template the "
                "service applies, the context a line must fit, the sequences one instance decodes at once, and "
                "how fair share weighs completion tokens. The expected completion is measured.",
                "fields": (
                    "context_length",
                    "tokenizer_dir",
                    "max_num_seqs",
                    "completion_weight",
                    "expected_completion_tokens",
                ),
                "classes": ("collapse",),
            },
        ),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[CatalogueModel]:
        return super().get_queryset(request).prefetch_related("placements")

    @admin.display(description="placed")
    def placed_instances(self, model: CatalogueModel) -> int:
        return sum(p.instances for p in model.placements.all())

    def _set_paused(self, request: HttpRequest, queryset: QuerySet[CatalogueModel], *, paused: bool) -> None:
        actor = request.user.get_username()
        changed = [m.name for m in queryset if model_set_paused(model_id=m.id, paused=paused, actor=actor)]
        verb = "Paused" if paused else "Resumed"
        self.message_user(request, f"{verb}: {', '.join(changed)}." if changed else f"{verb}: nothing to change.")

    @admin.action(description="Pause: dispatch no new shards of the selected models")
    def pause_dispatch(self, request: HttpRequest, queryset: QuerySet[CatalogueModel]) -> None:
        self._set_paused(request, queryset, paused=True)

    @admin.action(description="Resume dispatching the selected models' shards")
    def resume_dispatch(self, request: HttpRequest, queryset: QuerySet[CatalogueModel]) -> None:
        self._set_paused(request, queryset, paused=False)


def _has_measured_gpus(server: TritonServer | None) -> bool:
    return server is not None and server.gpus.filter(declared=False).exists()


class GpuInline(admin.TabularInline):
    """Declared GPUs are edited here; measured ones (Triton's /metrics) are overwritten by the heartbeat."""

    model = Gpu
    extra = 0
    fields = ("index", "name", "total_memory_bytes", "used_by_others_bytes", "declared", "utilization")
    readonly_fields = ("declared", "utilization")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.fields if _has_measured_gpus(obj) else self.readonly_fields

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not _has_measured_gpus(obj) and super().has_add_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return not _has_measured_gpus(obj) and super().has_delete_permission(request, obj)


@admin.register(TritonServer)
class TritonServerAdmin(AuditedAdmin, admin.ModelAdmin):
    list_display = (
        "name",
        "grpc_url",
        "pool",
        "state",
        "operator_state",
        "last_heartbeat_at",
        "breaker_open_until",
        "gpu_count",
        "placements_summary",
    )
    list_filter = ("state", "operator_state", "real_gpus", "pool")
    search_fields = ("name", "grpc_url")
    # Operator state changes go through the actions, which write a PlacementEvent.
    readonly_fields = (
        "state",
        "operator_state",
        "last_heartbeat_at",
        "missed_heartbeats",
        "consecutive_failures",
        "breaker_open_until",
    )
    fieldsets = (
        (None, {"fields": ("name", "grpc_url", "http_url", "metrics_url", "pool", "real_gpus")}),
        ("Health (heartbeat, circuit breaker and the actions on the list page)", {"fields": readonly_fields}),
    )
    inlines = (GpuInline,)
    actions = ("drain", "cordon", "return_to_normal", "rebalance_now")

    def get_queryset(self, request: HttpRequest) -> QuerySet[TritonServer]:
        return (
            super()
            .get_queryset(request)
            .annotate(gpu_count=Count("gpus", distinct=True))
            .prefetch_related("placements__model")
        )

    @admin.display(description="GPUs", ordering="gpu_count")
    def gpu_count(self, server: TritonServer) -> int:
        return server.gpu_count  # type: ignore[attr-defined]  # annotated in get_queryset

    @admin.display(description="placements")
    def placements_summary(self, server: TritonServer) -> str:
        rows = sorted(server.placements.all(), key=lambda p: (p.model.triton_name, p.gpus))
        return (
            ", ".join(
                f"{p.model.triton_name} ×{p.instances} gpu[{p.gpus}]"
                + ("" if p.status == "ready" else f" ({p.status})")
                for p in rows
            )
            or "—"
        )

    def _set_operator_state(
        self, request: HttpRequest, queryset: QuerySet[TritonServer], state: str | None, label: str
    ) -> None:
        names = []
        for server in queryset:
            server_set_operator_state(server=server, state=state, actor=request.user.get_username())
            names.append(server.name)
        self.message_user(
            request, f"{label}: {', '.join(names)}. The next reconcile moves placements (or use “Rebalance now”)."
        )

    @admin.action(description="Drain: move models off the selected servers")
    def drain(self, request: HttpRequest, queryset: QuerySet[TritonServer]) -> None:
        self._set_operator_state(request, queryset, ServerState.DRAINING, "Draining")

    @admin.action(description="Cordon: keep what they have, place nothing new")
    def cordon(self, request: HttpRequest, queryset: QuerySet[TritonServer]) -> None:
        self._set_operator_state(request, queryset, ServerState.CORDONED, "Cordoned")

    @admin.action(description="Return to normal scheduling")
    def return_to_normal(self, request: HttpRequest, queryset: QuerySet[TritonServer]) -> None:
        self._set_operator_state(request, queryset, None, "Back to normal scheduling")

    @admin.action(description="Rebalance now (reconciles the whole fleet)")
    def rebalance_now(self, request: HttpRequest, queryset: QuerySet[TritonServer]) -> None:
        error = dispatch.fleet_reconcile_now(actor=f"admin:{request.user.get_username()}")
        if error is not None:  # an admin button reports a broker failure, it never 500s
            self.message_user(
                request, f"Could not enqueue the rebalance (is the broker up?): {error}", level=messages.ERROR
            )
            return
        self.message_user(request, "Rebalance enqueued; results appear as placement events.")

    def get_urls(self) -> list[URLPattern]:
        # Before the default patterns, whose "<path:object_id>/" would otherwise swallow "overview/".
        overview = path("overview/", self.admin_site.admin_view(self.overview_view), name="fleet_tritonserver_overview")
        return [overview, *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> TemplateResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        context = {
            **self.admin_site.each_context(request),
            "title": "Fleet overview",
            "opts": self.opts,
            "overview": fleet_overview(),
        }
        return TemplateResponse(request, "admin/fleet/overview.html", context)


@admin.register(Placement)
class PlacementAdmin(ReadOnlyAdmin):
    list_display = (
        "model",
        "server",
        "gpus",
        "instances",
        "status",
        "failed_until",
        "load_failures",
        "avg_queue_ms",
        "avg_compute_ms",
        "last_error_short",
        "updated_at",
    )
    list_filter = ("status", "server", "model")
    list_select_related = ("model", "server")

    @admin.display(description="last error")
    def last_error_short(self, placement: Placement) -> str:
        error = placement.last_error
        return error if len(error) <= 120 else error[:119] + "…"


class CatalogueAdapterForm(forms.ModelForm):
    class Meta:
        model = CatalogueAdapter
        fields = "__all__"

    def clean_base(self) -> CatalogueModel:
        base: CatalogueModel = self.cleaned_data["base"]
        # Adapters select by vLLM's lora_name sampling parameter (kinds/generation/engine.py): generation only.
        if base.kind != ModelKind.GENERATION:
            raise ValidationError(f"{base.name} is not a generation model: only those serve LoRA adapters.")
        return base


@admin.register(CatalogueAdapter)
class CatalogueAdapterAdmin(AuditedAdmin, admin.ModelAdmin):
    """LoRA adapters served on a generation model (`base:name` in body.model). Disabling one makes its new lines
    400s; the engine's files are added with `python -m build_engines adapter add` (build_engines/README.md)."""

    form = CatalogueAdapterForm
    list_display = ("__str__", "base", "name", "rank", "is_enabled", "path", "memory_bytes", "created_at")
    list_filter = ("is_enabled", "base")
    search_fields = ("name", "base__name")
    list_select_related = ("base",)


@admin.register(PlacementEvent)
class PlacementEventAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "action", "model", "server", "gpus", "before", "after", "ok", "actor", "reason")
    list_filter = ("action", "ok", "actor")
    search_fields = ("reason",)
    list_select_related = ("model", "server")
    date_hierarchy = "created_at"


@admin.register(FleetSizePlan)
class FleetSizePlanAdmin(ReadOnlyAdmin):
    """The fleet-size loop's latest answer per pool (fleet.size_plan); ``inputs`` says what it came from."""

    list_display = ("pool", "desired_servers", "desired_workers", "computed_at", "reason")
    readonly_fields = ("pool", "desired_servers", "desired_workers", "inputs", "computed_at")

    @admin.display(description="why")
    def reason(self, plan: FleetSizePlan) -> str:
        return str(plan.inputs.get("reason", ""))
