from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.http.errors import DomainError
from controlplane.fleet.services import catalogue_set_min_instances


class Command(BaseCommand):
    help = (
        "Keep catalogue models loaded while idle (min_instances, default 1), so a first batch does not wait "
        "for a model load; --min-instances 0 lets them scale to zero again. The reconciler applies it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="+", help="catalogue names, e.g. all-MiniLM-L6-v2 identity")
        parser.add_argument("--min-instances", type=int, default=1)
        parser.add_argument("--actor", default="manage.py catalogue_warm", help="recorded in the placement events")

    def handle(self, *args: Any, names: list[str], min_instances: int, actor: str, **options: Any) -> None:
        try:
            models = catalogue_set_min_instances(names=names, min_instances=min_instances, actor=actor)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"min_instances={min_instances}: {', '.join(m.name for m in models)}.")
