"""The placement loop: signal → plan → apply. One run at a time (a lease row), make-before-break.

Each run: sync what Triton actually has loaded, read demand, ask the pure planner for the target, and
apply the difference through Triton's repository API in changes.execution_phases order — loads and
scale-ups first (a consolidation move's new instance among them), then scale-downs and unloads (a move's
old instance only once its new one is ready; not at all when that load failed), then the loads of the
models the moves made room for — recording every change as a PlacementEvent."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from controlplane.core.messaging import dispatch
from controlplane.core.observability.metrics import CONSOLIDATION_MOVES
from controlplane.core.workers.database import when_database_answers
from controlplane.fleet.models import (
    CatalogueModel,
    FleetLock,
    Gpu,
    Placement,
    PlacementEvent,
    PlacementStatus,
    ServerState,
    TritonServer,
    gpus_text,
    gpus_tuple,
)
from controlplane.fleet.placement import planner
from controlplane.fleet.placement import types as pt
from controlplane.fleet.placement.adapter_apply import adapters_reconcile
from controlplane.fleet.placement.changes import execution_phases
from controlplane.fleet.placement.demand import activity_touch, demand_by_model, lines_per_second_per_instance
from controlplane.fleet.placement.load_failures import load_failure_record
from controlplane.fleet.placement.memory import measured_bytes_per_instance, planned_bytes_per_instance
from controlplane.fleet.placement.moves import (
    change_event_record,
    models_only_loading,
    move_history,
    moves_planned_record,
)
from controlplane.fleet.placement.routing import ROUTE_CACHE_SECONDS
from controlplane.triton.client import TritonClient, TritonError, cpu_instances, repository_model_config

logger = logging.getLogger(__name__)
HOLDER = f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class ReconcileReport:
    ran: bool
    changes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def lock_acquire(name: str, ttl_s: float) -> bool:
    now = timezone.now()
    FleetLock.objects.get_or_create(name=name)
    won = FleetLock.objects.filter(Q(expires_at__isnull=True) | Q(expires_at__lt=now), name=name).update(
        holder=HOLDER, expires_at=now + timedelta(seconds=ttl_s)
    )
    return won == 1  # 0: another reconciler holds a live lease


def lock_release(name: str) -> None:
    FleetLock.objects.filter(name=name, holder=HOLDER).update(expires_at=None, holder="")


def _client(server: TritonServer) -> TritonClient:
    return TritonClient(server.grpc_url, timeout_s=settings.TRITON_TIMEOUT_SECONDS)


def _sync_actual_state(servers: list[TritonServer]) -> None:
    """Forget placements a server no longer has (it restarted, or someone unloaded by hand), and read
    Triton's queue/compute statistics for the ones it does."""
    for server in servers:
        if server.state == ServerState.UNHEALTHY:
            lost = Placement.objects.filter(server=server)
        else:
            client = _client(server)
            try:
                ready = {m["name"] for m in client.repository_index() if m.get("state") == "READY"}
                for placement in Placement.objects.filter(server=server, status=PlacementStatus.READY).select_related(
                    "model", "server"
                ):
                    if placement.model.triton_name in ready:
                        _record_statistics(client, placement)
            except TritonError:
                continue
            finally:
                client.close()
            lost = Placement.objects.filter(server=server, status=PlacementStatus.READY).exclude(
                model__triton_name__in=ready
            )
        for placement in lost.select_related("model"):
            PlacementEvent.objects.create(
                model=placement.model,
                server=server,
                gpus=placement.gpus,
                action="lost",
                before=placement.instances,
                ok=False,
                reason=f"server {server.state}: model not loaded there any more",
            )
            placement.delete()


def _record_statistics(client: TritonClient, placement: Placement) -> None:
    stats = client.model_statistics(placement.model.triton_name)
    measured = measured_bytes_per_instance(stats, instances=placement.instances, gpus=gpus_tuple(placement.gpus))
    if measured is not None and placement.server.real_gpus:
        Placement.objects.filter(id=placement.id).update(measured_memory_bytes=measured)
    for entry in stats.get("model_stats", []):
        inference = entry.get("inference_stats", {})
        count = int(inference.get("success", {}).get("count", 0) or 0)
        if count:
            queue_ns = int(inference.get("queue", {}).get("ns", 0) or 0)
            compute_ns = sum(
                int(inference.get(k, {}).get("ns", 0) or 0)
                for k in ("compute_input", "compute_infer", "compute_output")
            )
            Placement.objects.filter(id=placement.id).update(
                avg_queue_ms=queue_ns / count / 1e6, avg_compute_ms=compute_ns / count / 1e6
            )


def planner_inputs(now: float) -> tuple:
    servers = list(TritonServer.objects.all())
    names = {s.id: s.name for s in servers}
    models = list(CatalogueModel.objects.filter(is_enabled=True).select_related("pin_server"))
    demand = demand_by_model()
    activity_touch([name for name, d in demand.items() if d.pending_lines or d.in_flight_shards])
    demands, profiles = [], []
    last_moved, moves_done = move_history(settings.FLEET_PAYBACK_HORIZON_SECONDS)
    loading = models_only_loading()
    measured: dict[int, list[int | None]] = defaultdict(list)
    for model_id, value in Placement.objects.filter(status=PlacementStatus.READY).values_list(
        "model_id", "measured_memory_bytes"
    ):
        measured[model_id].append(value)
    failed: dict[int, list[str]] = defaultdict(list)
    for model_id, server_id in Placement.objects.filter(
        status=PlacementStatus.FAILED, failed_until__gt=timezone.now()
    ).values_list("model_id", "server_id"):
        failed[model_id].append(names[server_id])
    for m in CatalogueModel.objects.filter(id__in=[m.id for m in models]):
        d = demand.get(m.name)
        demands.append(
            pt.ModelDemand(
                model=m.triton_name,
                pending_lines=d.pending_lines if d else 0,
                lines_per_second_per_instance=lines_per_second_per_instance(m, d),
                last_active_at=m.last_active_at.timestamp() if m.last_active_at else None,
                in_flight=d.in_flight_shards if d else 0,
                loading=m.id in loading,
                last_moved_at=last_moved.get(m.id),
            )
        )
        profiles.append(
            pt.ModelProfile(
                model=m.triton_name,
                memory_per_instance_bytes=planned_bytes_per_instance(m.memory_per_instance_bytes, measured[m.id]),
                load_time_s=m.load_seconds,
                gpus_per_instance=m.gpus_per_instance,
                min_instances=m.min_instances,
                max_instances=max(1, m.max_instances),
                pin_server=m.pin_server.name if m.pin_server else None,
                pin_gpus=tuple(m.pin_gpus or ()),
                avoid_servers=tuple(failed[m.id]),
                pool=m.pool,
            )
        )
    current = [
        pt.Placement(p.model.triton_name, names[p.server_id], gpus_tuple(p.gpus), p.instances)
        for p in Placement.objects.filter(
            status__in=(PlacementStatus.READY, PlacementStatus.LOADING), instances__gt=0, model__is_enabled=True
        ).select_related("model")
    ]
    inventory = [pt.Server(s.name, pt.ServerState(s.state), s.pool) for s in servers]
    gpus = [
        pt.Gpu(names[g.server_id], g.index, g.total_memory_bytes, g.used_by_others_bytes) for g in Gpu.objects.all()
    ]
    params = pt.PlannerParams(
        now=now,
        idle_ttl_s=settings.FLEET_IDLE_TTL_SECONDS,
        interval_s=settings.FLEET_PAYBACK_HORIZON_SECONDS,
        hysteresis=settings.FLEET_HYSTERESIS,
        max_moves=settings.FLEET_MAX_MOVES_PER_INTERVAL,
        moves_done=moves_done,
        move_cooldown_s=settings.FLEET_MOVE_COOLDOWN_SECONDS,
    )
    return demands, inventory, gpus, profiles, current, params


def fleet_reconcile(*, actor: str = "reconciler") -> ReconcileReport:
    if not lock_acquire("reconcile", ttl_s=settings.FLEET_RECONCILE_LOCK_SECONDS):
        return ReconcileReport(ran=False)
    try:
        servers = list(TritonServer.objects.all())
        _sync_actual_state(servers)
        result = planner.plan(*planner_inputs(time.time()))
        report = _apply(result, actor)
        if report.changes:
            dispatch.slots_topup_enqueue()  # capacity changed: the dispatcher resizes every model's slots
        _adapters_apply(report, actor)
        return report
    finally:
        # Given back even when the run died on a database error (a Postgres restart closed its connection): left
        # held, no reconcile ran for FLEET_RECONCILE_LOCK_SECONDS (5 min; a hog run's chaos stack never reloaded
        # tinylm after a Triton restart that came right after a Postgres restart).
        when_database_answers(partial(lock_release, "reconcile"), within_s=settings.FLEET_RECONCILE_RELEASE_SECONDS)


def _adapters_apply(report: ReconcileReport, actor: str) -> None:
    """LoRA adapters on the instances placed now (fleet/placement/adapter_apply.py). Never fatal to the run: the
    placement above is applied already, and whatever failed here is tried again next cycle."""
    try:
        adapters = adapters_reconcile(actor=actor)
    except Exception:  # a bug or an outage in the adapter step must not stop placement
        logger.exception("adapter residency step failed; next cycle tries again")
        report.failures.append("adapter residency step failed (logged)")
        return
    report.changes += adapters.changes
    report.failures += adapters.failures


def _apply(result: pt.Plan, actor: str) -> ReconcileReport:
    report = ReconcileReport(ran=True)
    moves_planned_record(result, actor)
    unfreed: set[str] = set()  # models a move was for whose new instance failed to load: nothing freed
    for phase in execution_phases(result):
        groups: dict[tuple[str, str], list[pt.Change]] = defaultdict(list)
        for change in phase:
            if change.move_for in unfreed or change.model in unfreed:
                continue  # keep the moves' old instances; do not load into memory that was not freed
            groups[(change.model, change.server_id)].append(change)
        moved_in: list[tuple[CatalogueModel, TritonServer]] = []
        for (model_name, server_name), changes in groups.items():
            model = CatalogueModel.objects.get(triton_name=model_name)
            server = TritonServer.objects.get(name=server_name)
            blocked = Placement.objects.filter(
                model=model, server=server, status=PlacementStatus.FAILED, failed_until__gt=timezone.now()
            ).exists()
            grows = any(c.after > c.before for c in changes)
            ok, message = (False, "") if blocked and grows else _apply_group(model, server, changes, actor)
            if message:
                (report.changes if ok else report.failures).append(message)
            for c in changes:
                if c.move_for and c.after > c.before:
                    CONSOLIDATION_MOVES.labels(model_name, "ok" if ok else "failed").inc(c.after - c.before)
                    if ok:
                        moved_in.append((model, server))
                    else:
                        unfreed.add(c.move_for)
        for model, server in moved_in:
            _wait_ready(model, server)
    return report


def _wait_ready(model: CatalogueModel, server: TritonServer) -> None:
    """A moved instance's old copy goes only once the new one answers ready and dispatch's route cache
    (routing.ROUTE_CACHE_SECONDS) has had time to see it; the unload's own grace covers in-flight calls."""
    client = _client(server)
    try:
        deadline = time.monotonic() + settings.TRITON_TIMEOUT_SECONDS
        while time.monotonic() < deadline and not client.is_model_ready(model.triton_name):
            time.sleep(0.2)
    except TritonError as exc:
        logger.warning("readiness of moved %s on %s unknown: %s", model.triton_name, server.name, exc)
    finally:
        client.close()
    time.sleep(ROUTE_CACHE_SECONDS)


def _apply_group(model: CatalogueModel, server: TritonServer, changes: list[pt.Change], actor: str) -> tuple[bool, str]:
    target = {gpus_text(p.gpus): p.instances for p in _current_rows(model, server)}
    for change in changes:
        target[gpus_text(change.gpus)] = change.after
    target = {gpus: n for gpus, n in target.items() if n > 0}
    reason = "; ".join(c.reason or c.kind.value for c in changes)
    summary = f"{model.triton_name}@{server.name}: {', '.join(f'{c.kind.value} gpus[{gpus_text(c.gpus)}] {c.before}->{c.after}' for c in changes)}"
    client = _client(server)
    started = time.monotonic()
    try:
        if target:
            config = repository_model_config(settings.TRITON_MODEL_REPOSITORY, model.triton_name)
            config["instance_group"] = _instance_groups(server, target, cpu_per_instance=cpu_instances(config))
            gang = [g for g in target if "," in g]
            if server.real_gpus and gang:
                config.setdefault("parameters", {})["gpu_device_ids"] = {"string_value": ";".join(sorted(gang))}
            client.load_model(model.triton_name, config=config)
        elif server.state != ServerState.UNHEALTHY:
            # Dispatch stops routing here first (rows go before the unload), then in-flight calls finish.
            Placement.objects.filter(model=model, server=server).delete()
            time.sleep(settings.FLEET_UNLOAD_GRACE_SECONDS)
            client.unload_model(model.triton_name)
    except TritonError as exc:
        if target:
            load_failure_record(model, server, changes, str(exc), actor)
            return False, f"{summary}: {exc}"
        logger.warning(
            "unload of %s on %s failed (ignored, server may be gone): %s", model.triton_name, server.name, exc
        )
    finally:
        client.close()
    elapsed = time.monotonic() - started
    with transaction.atomic():
        Placement.objects.filter(model=model, server=server).exclude(gpus__in=list(target)).delete()
        for gpus, instances in target.items():
            Placement.objects.update_or_create(
                model=model,
                server=server,
                gpus=gpus,
                defaults={
                    "instances": instances,
                    "status": PlacementStatus.READY,
                    "failed_until": None,
                    "last_error": "",
                    "load_failures": 0,
                },
            )
        if any(c.before == 0 for c in changes) and target:
            # Measured load time feeds the planner's payback rule (smoothed: loads vary with host load).
            CatalogueModel.objects.filter(id=model.id).update(load_seconds=0.5 * model.load_seconds + 0.5 * elapsed)
        for c in changes:
            change_event_record(model, server, c, reason=c.reason or reason, actor=actor)
    return True, f"{summary} ({elapsed:.1f}s)"


def _current_rows(model: CatalogueModel, server: TritonServer) -> list[pt.Placement]:
    return [
        pt.Placement(model.triton_name, server.name, gpus_tuple(p.gpus), p.instances)
        for p in Placement.objects.filter(model=model, server=server, instances__gt=0).exclude(
            status=PlacementStatus.FAILED
        )
    ]


def _instance_groups(server: TritonServer, target: dict[str, int], *, cpu_per_instance: int = 1) -> list[dict]:
    """``cpu_per_instance``: Triton instances per placed instance on a CPU server, the repository config's
    KIND_CPU count. A config that asks for N single-thread CPU instances gets N stubs per placed instance,
    which keep N cores busy without the barrier one N-thread instance's threads meet at every operator
    (MiniLM on 2 cores beside the control plane: 0.90 of in-process end to end vs 0.76; docs/performance.md)."""
    if server.real_gpus:
        groups = []
        for gpus, count in sorted(target.items()):
            ids = list(gpus_tuple(gpus))
            if len(ids) == 1:
                groups.append({"count": count, "kind": "KIND_GPU", "gpus": ids})
            else:
                # Triton's `count` is per listed GPU, so {count, gpus: [0, 1]} would start single-GPU copies.
                # A gang (tensor-parallel) instance is one KIND_MODEL instance that the backend spreads
                # over its GPUs itself; _apply_group passes the ids as the `gpu_device_ids` parameter.
                groups.append({"count": count, "kind": "KIND_MODEL"})
        return groups
    # Declared GPUs on a CPU host: the instances exist as CPU instances; the memory accounting is the
    # planner's, against the declared inventory.
    return [{"count": sum(target.values()) * cpu_per_instance, "kind": "KIND_CPU"}]
