"""The audit log of the admin: ``AuditedAdmin`` is a mixin every ModelAdmin of the project puts first in its
bases. It records, as one AuditEntry each,

- add, change and delete (the admin's own ``log_addition`` / ``log_change`` / ``log_deletions`` hooks, which
  every save, list edit, inline edit and delete — bulk delete included — goes through), and
- every list action (requeue, cancel, drain, redeliver, …): ``get_actions`` wraps each action so the entry
  names the action, the selected objects, and how it ended.

It also applies the roles' rule for list actions: an action that declares no ``allowed_permissions`` of its
own changes state through a service, so it is offered only to users with ``core.run_admin_actions`` (the
operator and admin roles, roles.py); a viewer sees no action at all."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from django.contrib.admin import ModelAdmin
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from controlplane.core.models import AuditEntry

RUN_ACTIONS_PERMISSION = "core.run_admin_actions"
# Ids of the selection kept in an entry: enough to find the rows again, bounded for a select-all of 10,000.
AUDIT_MAX_IDS = 200


def audit_record(
    *,
    request: HttpRequest,
    action: str,
    model: type[Model],
    objects: Iterable[Model] = (),
    object_id: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    """Write one entry for an admin action by request.user on objects of model (or on the object with
    ``object_id``, for pages that act on an id, like the queue page)."""
    user = request.user
    first = next(iter(objects), None)
    return AuditEntry.objects.create(
        actor=user.get_username() if user.is_authenticated else "anonymous",
        actor_id=user.pk if user.is_authenticated else None,
        action=action[:100],
        app_label=model._meta.app_label,
        model=model._meta.model_name or "",
        object_id=object_id if first is None else str(first.pk),
        object_repr="" if first is None else str(first)[:500],
        details=details or {},
    )


def _audited_action(func: Callable[..., Any], name: str, description: str) -> Callable[..., Any]:
    @functools.wraps(func)
    def run(modeladmin: ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        # The selection as it was when the action started: an action may change the rows that match it.
        selected = list(queryset[: AUDIT_MAX_IDS + 1])
        details: dict[str, Any] = {
            "description": str(description),
            "selected": [str(obj.pk) for obj in selected[:AUDIT_MAX_IDS]],
            "count": len(selected) if len(selected) <= AUDIT_MAX_IDS else queryset.count(),
        }
        try:
            response = func(modeladmin, request, queryset)
        except Exception as exc:
            details["outcome"] = f"error: {type(exc).__name__}: {exc}"[:1000]
            audit_record(request=request, action=name, model=queryset.model, objects=selected, details=details)
            raise
        details["outcome"] = "done"
        audit_record(request=request, action=name, model=queryset.model, objects=selected, details=details)
        return response

    return run


class AuditedAdmin(ModelAdmin):  # type: ignore[type-arg]
    """Put first in a ModelAdmin's bases: ``class BatchAdmin(AuditedAdmin, admin.ModelAdmin)``."""

    def log_addition(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        audit_record(request=request, action="add", model=type(obj), objects=[obj], details={"changes": message})
        return super().log_addition(request, obj, message)

    def log_change(self, request: HttpRequest, obj: Model, message: Any) -> Any:
        audit_record(request=request, action="change", model=type(obj), objects=[obj], details={"changes": message})
        return super().log_change(request, obj, message)

    def log_deletions(self, request: HttpRequest, queryset: Any) -> Any:
        # Called before the rows go (the admin's delete view and the delete_selected action alike).
        objects = list(queryset)
        for obj in objects:
            audit_record(request=request, action="delete", model=type(obj), objects=[obj])
        return super().log_deletions(request, queryset)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        may_run = request.user.has_perm(RUN_ACTIONS_PERMISSION)
        out: dict[str, Any] = {}
        for name, entry in actions.items():
            if entry is None:
                continue
            func, action_name, description = entry
            if name == "delete_selected":
                out[name] = (func, action_name, description)  # delete permission guards it; log_deletions records it
                continue
            if not hasattr(func, "allowed_permissions") and not may_run:
                continue
            out[name] = (_audited_action(func, action_name, str(description)), action_name, description)
        return out


class ReadOnlyAdmin(AuditedAdmin):
    """Rows the system owns (placements, slots, the audit log itself): operators look, never edit."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
