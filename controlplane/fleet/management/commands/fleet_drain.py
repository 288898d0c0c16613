from __future__ import annotations

import time
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.fleet.membership.join_leave import server_drain
from controlplane.fleet.placement.reconciler import fleet_reconcile


class Command(BaseCommand):
    help = (
        "Drain a Triton server and deregister it: cordon, wait until the calls in flight there finish and its "
        "placements moved elsewhere, then remove it. Exit 0 when drained, 1 on timeout. Runs the placement loop "
        "itself while placements remain, so it works without beat. Same as POST /internal/fleet/servers/<name>/drain."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", required=True)
        # Five minutes: a placement move is a model load elsewhere (seconds to a minute for large models).
        parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")

    def handle(self, *args: Any, name: str, timeout: float, **options: Any) -> None:
        deadline = time.monotonic() + timeout
        while True:
            status = server_drain(name=name, actor="fleet_drain")
            if status.drained:
                self.stdout.write(f"{name} drained and deregistered.")
                return
            if status.placements:
                fleet_reconcile(actor="fleet_drain")
            if time.monotonic() >= deadline:
                raise CommandError(
                    f"{name} still draining after {timeout:g}s: {status.placements} placement(s), "
                    f"{status.running_shards} running shard(s), pending requests {status.pending_requests}",
                    returncode=1,
                )
            time.sleep(settings.FLEET_SCALING.drain_poll_s)
