"""Waiting until catalogue models are served: a deploy step ("open traffic once warm") and what the local
runner does before it hands the stack over, so the first batch does not wait for a model load.

Ready means a READY placement row on a routable server *and* that server's Triton reporting the model
ready: a row alone may be stale (a server restarted since, until the next reconcile notices)."""

from __future__ import annotations

import time
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from controlplane.core.http.errors import DomainError, NotFound
from controlplane.fleet.membership.inventory import fleet_heartbeat
from controlplane.fleet.models import CatalogueModel, Placement, PlacementStatus
from controlplane.fleet.placement.reconciler import fleet_reconcile
from controlplane.fleet.selectors import ROUTABLE_STATES
from controlplane.triton.client import TritonClient, TritonError


class ModelsNotReady(DomainError):
    status_code = 503
    code = "models_not_ready"


def models_not_ready(*, names: list[str]) -> dict[str, str]:
    """Catalogue name → why it is not served yet, for each of `names` that is not; {} when all are."""
    models = {m.name: m for m in CatalogueModel.objects.filter(name__in=names)}
    unknown = sorted(set(names) - set(models))
    if unknown:
        raise NotFound(f"no catalogue model named {', '.join(map(repr, unknown))}")
    waiting: dict[str, str] = {}
    clients: dict[str, TritonClient] = {}
    try:
        for name in dict.fromkeys(names):
            model = models[name]
            rows = list(
                Placement.objects.filter(
                    model=model, status=PlacementStatus.READY, instances__gt=0, server__state__in=ROUTABLE_STATES
                ).select_related("server")
            )
            if not rows:
                waiting[name] = "no ready placement on a routable server"
                continue
            for row in rows:
                url = row.server.grpc_url
                if url not in clients:
                    clients[url] = TritonClient(url, timeout_s=settings.FLEET_PROBE_TIMEOUT_SECONDS)
                try:
                    if clients[url].is_model_ready(model.triton_name):
                        break
                except TritonError:
                    pass
            else:
                waiting[name] = f"placed on {', '.join(r.server.name for r in rows)} but not loaded there (yet)"
    finally:
        for client in clients.values():
            client.close()
    return waiting


def _failures_since(names: list[str], since: datetime) -> list[str]:
    return [
        f"{p.model.name} on {p.server.name}: {p.last_error}"
        for p in Placement.objects.filter(
            model__name__in=names,
            status=PlacementStatus.FAILED,
            updated_at__gte=since,
        ).select_related("model", "server")
    ]


def fleet_wait_ready(*, names: list[str], timeout_s: float, actor: str, poll_s: float = 1.0) -> float:
    """Probe and reconcile now (rather than on the next beat) until every named model is served; returns
    the seconds it took. A load failure of one of them since the call began ends the wait at once
    (the reconciler backs off from that server for minutes); ModelsNotReady says which and why."""
    started, clock = timezone.now(), time.monotonic()
    deadline = clock + timeout_s
    reconciled = False
    while True:
        fleet_heartbeat()
        # Refused (ran=False) while another reconcile holds the lease: that one makes progress instead.
        if fleet_reconcile(actor=actor).ran:
            reconciled = True
        waiting = models_not_ready(names=names)
        if not waiting:
            return time.monotonic() - clock
        failures = _failures_since(list(waiting), started)
        if failures:
            raise ModelsNotReady("load failed: " + "; ".join(failures))
        if time.monotonic() >= deadline:
            lease = "" if reconciled else " (every reconcile was refused: another holds the reconcile lease)"
            raise ModelsNotReady(
                f"not ready after {timeout_s:g}s{lease}: "
                + "; ".join(f"{name}: {why}" for name, why in waiting.items())
            )
        time.sleep(poll_s)
