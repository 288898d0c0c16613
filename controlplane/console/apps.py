from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db.models.signals import post_migrate


def _roles_sync_after_migrate(sender: AppConfig, **kwargs: Any) -> None:
    from controlplane.console.roles import roles_sync

    # Every `migrate` brings the roles up to date with the models it created (roles.py).
    roles_sync(apps=kwargs.get("apps") or sender.apps, verbosity=0)


class ConsoleConfig(AppConfig):
    """The operators' console: dashboards from stored samples, roles, and the audit log of admin actions."""

    name = "controlplane.console"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Once per migrate (sender=this app), after Django's own handlers created the content types.
        post_migrate.connect(_roles_sync_after_migrate, sender=self, dispatch_uid="console_roles_sync")
