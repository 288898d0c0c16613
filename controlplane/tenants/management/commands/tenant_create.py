from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.errors import DomainError
from controlplane.tenants.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant and print its new API key as the last line (it is shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        try:
            tenant, raw_key = tenant_create(name=name)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"Created tenant {tenant.name!r} (id {tenant.id}). API key, shown only once:")
        self.stdout.write(raw_key)
