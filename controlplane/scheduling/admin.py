"""Operator side of the scheduler: the queue page (per model and class, tenants' shares, deadline risk)
with its actions, and read-only lists of dispatch slots and tenants' virtual times.

The queue page hangs off the Slot admin (/admin/scheduling/slot/queue/): an admin URL needs a registered
model, and a model of its own would need a migration for a page that stores nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone

from controlplane.batches.models import Batch
from controlplane.batches.priority import batch_priority_set
from controlplane.core.audit import RUN_ACTIONS_PERMISSION, ReadOnlyAdmin, audit_record
from controlplane.core.http.errors import DomainError
from controlplane.fleet.models import CatalogueModel
from controlplane.fleet.services import model_set_paused
from controlplane.scheduling.models import Slot, TenantShare
from controlplane.scheduling.queue_overview import queue_overview
from controlplane.tenants.models import Priority, Tenant
from controlplane.tenants.services import tenant_set_paused


class QueueActionForm(forms.Form):
    """One form for the queue page's buttons: which action, and the fields that action needs."""

    NEEDS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "batch_priority": ("batch_id", "priority"),
        "tenant_paused": ("tenant_id",),
        "model_paused": ("model_id",),
    }
    PERMISSIONS: ClassVar[Mapping[str, str]] = {
        "batch_priority": "batches.change_batch",
        "tenant_paused": "tenants.change_tenant",
        "model_paused": "fleet.change_cataloguemodel",
    }

    op = forms.ChoiceField(choices=[(op, op) for op in NEEDS])
    batch_id = forms.CharField(required=False, max_length=40)
    priority = forms.ChoiceField(required=False, choices=Priority.choices)
    tenant_id = forms.IntegerField(required=False)
    model_id = forms.IntegerField(required=False)
    paused = forms.TypedChoiceField(
        required=False, choices=[("1", "pause"), ("0", "resume")], coerce=lambda v: v == "1"
    )

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        op = cleaned.get("op")
        if op:
            missing = [name for name in self.NEEDS[op] if cleaned.get(name) in (None, "")]
            if op != "batch_priority" and self.data.get("paused") not in ("0", "1"):
                missing.append("paused")
            if missing:
                raise forms.ValidationError(f"{op} needs {', '.join(missing)}.")
        return cleaned


# Slots and shares are the scheduler's rows: operators look, and steer through the queue page's actions.
@admin.register(Slot)
class SlotAdmin(ReadOnlyAdmin):
    list_display = ("id", "model", "state", "owner", "created_at", "expires_at")
    list_filter = ("state", "model")
    list_select_related = ("model",)

    def get_urls(self) -> list[URLPattern]:
        # Before the default patterns, whose "<path:object_id>/" would otherwise swallow "queue/".
        queue = path("queue/", self.admin_site.admin_view(self.queue_view), name="scheduling_slot_queue")
        return [queue, *super().get_urls()]

    def queue_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            self._queue_action(request)
            # Post/redirect/get: a reload does not repeat the action.
            return HttpResponseRedirect(reverse("admin:scheduling_slot_queue"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue",
            "opts": self.opts,
            "queue": queue_overview(now=timezone.now()),
            "priorities": Priority.values,
            # Viewers see the queue without the buttons they could not use (the POST checks again).
            "can_act": request.user.has_perm(RUN_ACTIONS_PERMISSION)
            or any(request.user.has_perm(perm) for perm in QueueActionForm.PERMISSIONS.values()),
        }
        return TemplateResponse(request, "admin/scheduling/queue.html", context)

    def _queue_action(self, request: HttpRequest) -> None:
        form = QueueActionForm(request.POST)
        if not form.is_valid():
            self.message_user(request, f"Nothing changed: {form.errors.as_text()}", level=messages.ERROR)
            return
        data, actor = form.cleaned_data, request.user.get_username()
        # The operator role runs these buttons without change permissions (controlplane/console/roles.py).
        if not request.user.has_perm(QueueActionForm.PERMISSIONS[data["op"]]) and not request.user.has_perm(
            RUN_ACTIONS_PERMISSION
        ):
            raise PermissionDenied
        try:
            if data["op"] == "batch_priority":
                changed = batch_priority_set(batch_id=data["batch_id"], priority=data["priority"], actor=actor)
                subject = f"Batch {data['batch_id']} priority set to {data['priority']}"
            elif data["op"] == "tenant_paused":
                changed = tenant_set_paused(tenant_id=data["tenant_id"], paused=data["paused"], actor=actor)
                subject = f"Tenant {data['tenant_id']} {'paused' if data['paused'] else 'resumed'}"
            else:
                changed = model_set_paused(model_id=data["model_id"], paused=data["paused"], actor=actor)
                subject = f"Model {data['model_id']} {'paused' if data['paused'] else 'resumed'}"
        except DomainError as exc:
            self.message_user(request, exc.message, level=messages.ERROR)
            return
        target = {"batch_priority": "batch_id", "tenant_paused": "tenant_id", "model_paused": "model_id"}[data["op"]]
        audit_record(
            request=request,
            action=f"queue_{data['op']}",
            model={"batch_priority": Batch, "tenant_paused": Tenant, "model_paused": CatalogueModel}[data["op"]],
            object_id=str(data[target]),
            details={"result": subject, "changed": bool(changed)},
        )
        self.message_user(request, f"{subject}." if changed else f"{subject}: it already was.")


@admin.register(TenantShare)
class TenantShareAdmin(ReadOnlyAdmin):
    list_display = ("tenant", "weight", "vtime", "vtime_at", "served_work_units")
    list_select_related = ("tenant",)
    search_fields = ("tenant__name",)

    @admin.display(description="weight", ordering="tenant__weight")
    def weight(self, share: TenantShare) -> float:
        return share.tenant.weight
