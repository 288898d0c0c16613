from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.http.errors import DomainError
from controlplane.tenants.management.options import add_expiry_arguments, expiry_from_options
from controlplane.tenants.models import Tenant
from controlplane.tenants.services import api_key_create


class Command(BaseCommand):
    help = "Create another API key for a tenant and print it as the last line (it is shown only once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="the tenant's name")
        parser.add_argument("--name", default="", help="a label for operators, e.g. 'ci' or 'rotation 2027-01'")
        add_expiry_arguments(parser)

    def handle(self, *args: Any, tenant: str, name: str, **options: Any) -> None:
        owner = Tenant.objects.filter(name=tenant).first()
        if owner is None:
            raise CommandError(f"No tenant named {tenant!r}.")
        expires_at = expiry_from_options(options)
        try:
            key, raw_key = api_key_create(tenant=owner, name=name, expires_at=expires_at)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        expiry = f"expires {expires_at.isoformat()}" if expires_at else "no expiry"
        self.stdout.write(f"Created key {key.prefix}… for {owner.name!r} ({expiry}). API key, shown only once:")
        self.stdout.write(raw_key)
