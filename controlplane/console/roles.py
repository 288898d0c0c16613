"""Operator roles as Django groups, created by the console's data migration and kept in sync by
``manage.py roles_sync`` (run it after a deploy that adds models: a new model's permissions join the roles).

- ``viewer``: every ``view_*`` permission of the project's apps (controlplane.*): the lists, the change pages
  read-only, the queue and fleet pages, the dashboards and the audit log. No list action is offered.
- ``operator``: viewer plus ``core.run_admin_actions``: the list actions (requeue dead shards, cancel,
  re-run failed lines, set priority, pause/resume tenants and models, drain/cordon servers, rebalance,
  redeliver webhooks, revoke keys) and the queue page's buttons. Operators still edit no form.
- ``admin``: every permission, users and groups included (``auth``).

A role gives no admin access by itself: the user also needs ``is_staff``. Superusers have every permission
whatever their groups."""

from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps
from django.contrib.auth.management import create_permissions

# Apps whose models the viewer and operator roles see: the service's own (not Django's auth or sessions).
PROJECT_APP_PREFIX = "controlplane."
ROLES = ("viewer", "operator", "admin")
# By codename: the permission was console's until AuditEntry moved to core (core 0003), and this migration-time
# sync (console 0002) runs before the move on a fresh database.
OPERATOR_EXTRA = ("run_admin_actions",)


def _project_labels() -> set[str]:
    # From the installed apps: a migration's app registry knows apps by label only, not by module name.
    return {config.label for config in global_apps.get_app_configs() if config.name.startswith(PROJECT_APP_PREFIX)}


def roles_sync(*, apps: Any = global_apps, verbosity: int = 0) -> dict[str, int]:
    """Create the groups if missing and set each one's permissions to exactly its role's. Idempotent.
    ``apps`` is the app registry: the migration's historical one, or the live one for the command.
    Returns role → number of permissions."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    # On a fresh database the permissions are created after the last migration (post_migrate): create them
    # now, so the roles are complete straight after `migrate`.
    for config in apps.get_app_configs():
        stub = (
            getattr(config, "models_module", None) is None
        )  # a migration's app configs: create_permissions skips them
        if stub:
            config.models_module = True
        try:
            create_permissions(config, verbosity=verbosity, apps=apps)
        finally:
            if stub:
                config.models_module = None
    labels = _project_labels()
    everything = Permission.objects.all()
    viewer = everything.filter(content_type__app_label__in=labels, codename__startswith="view_")
    operator_ids = set(viewer.values_list("id", flat=True))
    for codename in OPERATOR_EXTRA:
        operator_ids |= set(
            everything.filter(content_type__app_label__in=labels, codename=codename).values_list("id", flat=True)
        )
    wanted = {
        "viewer": set(viewer.values_list("id", flat=True)),
        "operator": operator_ids,
        "admin": set(everything.values_list("id", flat=True)),
    }
    counts = {}
    for role in ROLES:
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set(wanted[role])
        counts[role] = len(wanted[role])
    return counts
