from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.http.errors import DomainError
from controlplane.tenants.management.options import add_expiry_arguments, expiry_from_options
from controlplane.tenants.services import tenant_create


class Command(BaseCommand):
    help = "Create a tenant and print its new API key as the last line (it is shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        add_expiry_arguments(parser)

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        expires_at = expiry_from_options(options)
        try:
            tenant, raw_key = tenant_create(name=name, key_expires_at=expires_at)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        expiry = f", expires {expires_at.isoformat()}" if expires_at else ""
        self.stdout.write(f"Created tenant {tenant.name!r} (id {tenant.id}){expiry}. API key, shown only once:")
        self.stdout.write(raw_key)
