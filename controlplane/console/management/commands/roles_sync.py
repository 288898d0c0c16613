"""`manage.py roles_sync`: create the viewer, operator and admin groups and set their permissions
(controlplane/console/roles.py says who gets what). Idempotent; `migrate` runs it too."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from controlplane.console.roles import roles_sync


class Command(BaseCommand):
    help = "Create or update the viewer, operator and admin groups (docs/operations/console.md, 'Roles')."

    def handle(self, *args: Any, **options: Any) -> None:
        for role, count in roles_sync(verbosity=options["verbosity"]).items():
            self.stdout.write(f"{role}: {count} permissions")
