from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.http.errors import DomainError
from controlplane.fleet.placement.readiness import fleet_wait_ready


class Command(BaseCommand):
    help = (
        "Wait until the named catalogue models are loaded on a routable server, probing and reconciling at "
        "once instead of on the next beat. Exits non-zero on a load failure or after --timeout."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("names", nargs="+", help="catalogue names, e.g. all-MiniLM-L6-v2 identity")
        parser.add_argument("--timeout", type=float, default=120.0, help="seconds (default 120)")
        parser.add_argument("--actor", default="manage.py fleet_wait_ready", help="recorded in the placement events")

    def handle(self, *args: Any, names: list[str], timeout: float, actor: str, **options: Any) -> None:
        try:
            seconds = fleet_wait_ready(names=names, timeout_s=timeout, actor=actor)
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(f"ready after {seconds:.1f}s: {', '.join(dict.fromkeys(names))}.")
