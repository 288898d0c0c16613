"""The reconciler's adapter step: for each base model with LoRA adapters, ask each server it is placed on which
adapters its engine holds, plan residency (the pure fleet/placement/adapters.py) from each adapter's demand, and
send the loads and unloads through triton/lora.py, the base never restarted. A server that fails to answer or to
act is logged, its event recorded as failed, and tried again next cycle."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from controlplane.fleet.models import (
    CatalogueAdapter,
    CatalogueModel,
    Placement,
    PlacementEvent,
    PlacementStatus,
    ServerState,
    TritonServer,
)
from controlplane.fleet.placement.adapters import ActionKind, AdapterInstance, AdapterUse, residency_plan
from controlplane.fleet.placement.demand import adapter_activity_touch, demand_by_adapter
from controlplane.triton.client import TritonClient, TritonError
from controlplane.triton.lora import CONTROL_INPUT, lora_control

logger = logging.getLogger(__name__)
ENGINE_LIMIT = "MAX_LORAS"  # the engine's own bound (triton_models/tinylm/1/cb_lora.py evicts past it)


@dataclass
class AdapterReport:
    changes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def adapter_capacity(config: dict[str, Any], *, slots: int) -> int | None:
    """Adapters one instance may hold: the served config's MAX_LORAS and the reconciler's ``slots``
    (FLEET_ADAPTER_SLOTS), the smaller of those set; None when neither is (no limit)."""
    raw = config.get("parameters", {}).get(ENGINE_LIMIT, {}).get("string_value", "") or "0"
    try:
        engine = int(raw)
    except ValueError:
        engine = 0  # the engine itself refuses to start on it; the plan then sets no bound of its own
    limits = [n for n in (engine, slots) if n > 0]
    return min(limits) if limits else None


def adapters_reconcile(*, actor: str) -> AdapterReport:
    report = AdapterReport()
    demand = demand_by_adapter()
    adapter_activity_touch(demand)
    bases = CatalogueModel.objects.filter(is_enabled=True, adapters__isnull=False).distinct()
    for base in bases:
        catalogue = list(CatalogueAdapter.objects.filter(base=base))
        wanted = demand.get(base.name, {})
        uses = {
            a.name: AdapterUse(
                pending_lines=wanted.get(a.name, 0),
                last_used_at=a.last_active_at.timestamp() if a.last_active_at else None,
            )
            for a in catalogue
            if a.is_enabled or wanted.get(a.name)  # a disabled adapter's lines validated before still run
        }
        _base_reconcile(base, uses, actor, report)
    return report


def _base_reconcile(base: CatalogueModel, uses: dict[str, AdapterUse], actor: str, report: AdapterReport) -> None:
    server_ids = (
        Placement.objects.filter(model=base, status=PlacementStatus.READY, instances__gt=0)
        .exclude(server__state=ServerState.UNHEALTHY)
        .values_list("server_id", flat=True)
    )
    servers = {s.name: s for s in TritonServer.objects.filter(id__in=list(server_ids))}
    instances = []
    for server in servers.values():
        try:
            with TritonClient(server.grpc_url, timeout_s=settings.TRITON_TIMEOUT_SECONDS) as client:
                config = client.model_config(base.triton_name)
            if not any(i.get("name") == CONTROL_INPUT for i in config.get("input", [])):
                continue  # an engine without the control request (vLLM's backend) keeps its adapters itself
            loaded = lora_control(server.grpc_url, base.triton_name, "list", timeout_s=settings.TRITON_TIMEOUT_SECONDS)
            capacity = adapter_capacity(config, slots=settings.FLEET_ADAPTER_SLOTS)
        except TritonError as exc:
            logger.warning("adapters of %s on %s unknown (next cycle tries again): %s", base.name, server.name, exc)
            report.failures.append(f"{base.triton_name}@{server.name}: adapter list: {exc}")
            continue
        instances.append(AdapterInstance(server.name, frozenset(loaded), capacity))
    plan = residency_plan(instances, uses, hysteresis=settings.FLEET_HYSTERESIS)
    held = {i.server: len(i.loaded) for i in instances}
    for action in plan.actions:
        server = servers[action.server]
        verb = "load" if action.kind == ActionKind.LOAD else "unload"
        before = held[action.server]
        summary = f"{base.triton_name}@{server.name}: {verb} adapter {action.adapter}"
        try:
            held[action.server] = len(
                lora_control(
                    server.grpc_url,
                    base.triton_name,
                    verb,
                    name=action.adapter,
                    timeout_s=settings.TRITON_TIMEOUT_SECONDS,
                )
            )
            ok, error = True, ""
            report.changes.append(f"{summary} ({action.reason})")
        except TritonError as exc:
            logger.warning("%s failed (next cycle tries again): %s", summary, exc)
            ok, error = False, f": {exc}"
            report.failures.append(f"{summary}: {exc}")
        PlacementEvent.objects.create(
            model=base,
            server=server,
            action=action.kind.value,
            before=before,
            after=held[action.server],
            ok=ok,
            reason=f"{action.adapter}: {action.reason}{error}",
            actor=actor,
        )
