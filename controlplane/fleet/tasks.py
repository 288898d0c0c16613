"""Beat tasks of the placement loop. Both are no-ops when no Triton server is registered (the service then
runs unmanaged on TRITON_GRPC_URLS); the local runner registers its own Triton, so they run there too."""

from __future__ import annotations

from celery import shared_task

from controlplane.fleet.inventory import fleet_heartbeat
from controlplane.fleet.reconciler import fleet_reconcile


@shared_task(name="fleet.heartbeat")
def fleet_heartbeat_task() -> dict[str, str]:
    return fleet_heartbeat()


# Overlapping runs are refused by the reconcile lease, so a slow load never runs two plans at once.
@shared_task(name="fleet.reconcile")
def fleet_reconcile_task(actor: str = "beat") -> list[str]:
    report = fleet_reconcile(actor=actor)
    return report.changes + report.failures
