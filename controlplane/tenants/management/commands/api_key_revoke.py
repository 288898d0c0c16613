from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.tenants.models import ApiKey
from controlplane.tenants.services import api_key_revoke


class Command(BaseCommand):
    help = "Revoke an API key for good, by its prefix (as shown in the admin, e.g. sk-cp-AbC123)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("prefix")
        parser.add_argument("--actor", default="cli", help="recorded in the tenant's history")

    def handle(self, *args: Any, prefix: str, actor: str, **options: Any) -> None:
        keys = list(ApiKey.objects.filter(prefix=prefix.rstrip("…")).select_related("tenant"))
        if len(keys) != 1:
            raise CommandError(f"{len(keys)} keys have the prefix {prefix!r}; revoke it in the admin instead.")
        key = keys[0]
        if api_key_revoke(key_id=key.id, actor=actor):
            self.stdout.write(f"Revoked {key.prefix}… of {key.tenant.name!r}.")
        else:
            self.stdout.write(f"{key.prefix}… of {key.tenant.name!r} was already revoked.")
