"""Beat tasks of the placement loop. Both are no-ops when no Triton server is registered (the service then
runs unmanaged on TRITON_GRPC_URLS); the local runner registers its own Triton, so they run there too."""

from __future__ import annotations

from celery import shared_task

from controlplane.fleet.membership.inventory import fleet_heartbeat, fleet_lost_models
from controlplane.fleet.models import ServerState, TritonServer
from controlplane.fleet.placement.reconciler import fleet_reconcile
from controlplane.fleet.sizing.plans import fleet_size_plan


@shared_task(name="fleet.heartbeat")
def fleet_heartbeat_task() -> dict[str, str]:
    unhealthy = set(TritonServer.objects.filter(state=ServerState.UNHEALTHY).values_list("name", flat=True))
    states = fleet_heartbeat()
    back = any(states.get(name, ServerState.UNHEALTHY) != ServerState.UNHEALTHY for name in unhealthy)
    # A server is back (restarted empty, or resumed after a hang) and its placements were forgotten while
    # it was away, or it restarted between two heartbeats and lost its models without ever being marked
    # unhealthy: place its models now, not on the next reconcile tick up to 10 s later, so work resumes
    # within seconds of it answering (tests/chaos measured 13 s after a 10 s SIGSTOP, 8.5 s after a 3 s
    # restart).
    if back or fleet_lost_models():
        fleet_reconcile(actor="heartbeat")
    return states


# Overlapping runs are refused by the reconcile lease, so a slow load never runs two plans at once.
@shared_task(name="fleet.reconcile")
def fleet_reconcile_task(actor: str = "beat") -> list[str]:
    report = fleet_reconcile(actor=actor)
    return report.changes + report.failures


# Every FLEET_SIZE_INTERVAL_SECONDS (10 s, settings/fleet.py): a few grouped queries, no Triton call.
# Runs with or without registered servers: a pool at zero is exactly when its first work must wake it.
@shared_task(name="fleet.size_plan")
def fleet_size_plan_task() -> dict[str, int]:
    plan = fleet_size_plan(actor="beat")
    return {pool.pool: pool.desired_servers for pool in plan.pools} | {"workers": plan.desired_workers}
