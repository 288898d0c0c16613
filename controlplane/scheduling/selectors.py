"""Reads of the scheduler: what is runnable per model (as policy candidates), tenants' virtual times,
each model's slot capacity, and a batch's place in its model's queue."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from controlplane.batches.models import SHARD_OPEN_STATUSES, Batch, BatchStatus, Shard, ShardStatus
from controlplane.fleet.models import CatalogueModel, Placement, PlacementStatus, ServerState
from controlplane.fleet.routing import fleet_is_managed
from controlplane.scheduling import policy
from controlplane.scheduling.models import SchedulerClock, Slot, SlotState, TenantShare
from controlplane.tenants.models import Priority, Tenant

_ROUTABLE = (ServerState.HEALTHY, ServerState.CORDONED)


def policy_config() -> policy.PolicyConfig:
    return policy.PolicyConfig(
        aging_seconds=settings.SCHEDULER_AGING_SECONDS,
        half_life_seconds=settings.SCHEDULER_HALF_LIFE_SECONDS,
        deadline_fraction=settings.SCHEDULER_DEADLINE_FRACTION,
        fifo=settings.SCHEDULER_POLICY == "fifo",
    )


def runnable_q(now: datetime) -> Q:
    """A pending shard may be claimed: its batch runs, nobody paused it, and any deferral has passed."""
    return (
        Q(status=ShardStatus.PENDING, batch__status=BatchStatus.IN_PROGRESS, batch__stop_reason__isnull=True,
          batch__tenant__paused=False)
        & (Q(not_before__isnull=True) | Q(not_before__lte=now))
    )


def runnable_shards(*, model: CatalogueModel, now: datetime) -> QuerySet[Shard]:
    if model.paused:
        return Shard.objects.none()
    return Shard.objects.filter(runnable_q(now), batch__model=model.name)


def model_call_cap(model: CatalogueModel) -> int:
    """Triton calls in flight the model may have across the fleet: the catalogue's cap, or a default
    per ready instance (unmanaged: per configured server, one instance each)."""
    if model.max_inflight_calls:
        return model.max_inflight_calls
    if fleet_is_managed():
        instances = Placement.objects.filter(
            model=model, status=PlacementStatus.READY, instances__gt=0, server__state__in=_ROUTABLE
        ).aggregate(n=Sum("instances"))["n"] or 0
    else:
        instances = len(settings.TRITON_GRPC_URLS)
    return int(instances) * settings.SCHEDULER_CALLS_PER_INSTANCE


def model_slot_cap(model: CatalogueModel) -> int:
    """Slots (shards at once) = call cap ÷ calls per shard; at least one while the model can run at all."""
    cap = model_call_cap(model)
    return max(1, cap // settings.DISPATCH_INFLIGHT_CALLS) if cap > 0 else 0


def model_throughput(model: CatalogueModel, slots: int) -> float:
    """Work units per second the model sustains with its slots (0 = unknown)."""
    if model.seconds_per_work_unit <= 0 or slots <= 0:
        return 0.0
    return slots / model.seconds_per_work_unit


def _ts(value: datetime | None, default: datetime) -> float:
    return (value or default).timestamp()


def runnable_candidates(*, model: CatalogueModel, now: datetime, throughput: float) -> list[policy.Candidate]:
    """One candidate per batch of the model with a runnable shard."""
    rows = (
        runnable_shards(model=model, now=now)
        .values(
            "batch_id", "batch__tenant_id", "batch__priority", "batch__created_at", "batch__last_dispatched_at",
            "batch__in_progress_at", "batch__expires_at",
        )
        .annotate(work=Sum("work_units"), shards=Count("id"))
    )
    remaining = _remaining_work([row["batch_id"] for row in rows])
    return [
        policy.Candidate(
            batch_id=row["batch_id"], tenant_id=row["batch__tenant_id"], priority=policy.Priority(row["batch__priority"]),
            created_at=row["batch__created_at"].timestamp(),
            waiting_since=_ts(row["batch__last_dispatched_at"] or row["batch__in_progress_at"], row["batch__created_at"]),
            expires_at=row["batch__expires_at"].timestamp(),
            remaining_work=float(remaining.get(row["batch_id"], row["work"] or 0)),
            throughput=throughput,
            next_shard_work=float(row["work"] or 0) / max(1, row["shards"]),
        )
        for row in rows
    ]


def _remaining_work(batch_ids: list[str]) -> dict[str, int]:
    """Work units of each batch still pending or running (deadline risk counts both)."""
    if not batch_ids:
        return {}
    rows = (
        Shard.objects.filter(batch_id__in=batch_ids, status__in=(ShardStatus.PENDING, ShardStatus.RUNNING))
        .values("batch_id").annotate(work=Sum("work_units"))
    )
    return {row["batch_id"]: int(row["work"] or 0) for row in rows}


def tenant_shares(tenant_ids: Iterable[int]) -> dict[int, policy.TenantShare]:
    rows = TenantShare.objects.filter(tenant_id__in=set(tenant_ids)).values(
        "tenant_id", "vtime", "vtime_at", "tenant__weight"
    )
    return {
        row["tenant_id"]: policy.TenantShare(
            tenant_id=row["tenant_id"], clock=policy.Clock(row["vtime"], row["vtime_at"].timestamp()),
            weight=max(row["tenant__weight"], 1e-6),
        )
        for row in rows
    }


def system_clock() -> policy.Clock:
    row = SchedulerClock.objects.filter(name="default").values("vtime", "vtime_at").first()
    if row is None:
        return policy.Clock(0.0, timezone.now().timestamp())
    return policy.Clock(row["vtime"], row["vtime_at"].timestamp())


def model_ranking(*, model: CatalogueModel, now: datetime) -> tuple[list[policy.Candidate], float]:
    """Runnable batches of a model in the order the next claims will serve them, and the throughput used."""
    throughput = model_throughput(model, model_slot_cap(model))
    candidates = runnable_candidates(model=model, now=now, throughput=throughput)
    if not candidates:
        return [], throughput
    shares = tenant_shares(c.tenant_id for c in candidates)
    ranked = policy.rank(candidates, shares, system_clock(), now.timestamp(), policy_config())
    return ranked, throughput


def batches_queue_info(batches: Iterable[Batch]) -> dict[str, dict[str, Any]]:
    """For in_progress batches with runnable shards: their position among the model's runnable batches
    (1 = served by the next free slot) and an estimated start of their next shard."""
    by_model: dict[str, list[str]] = {}
    for batch in batches:
        if batch.status == BatchStatus.IN_PROGRESS and batch.model and not batch.stop_reason:
            by_model.setdefault(batch.model, []).append(batch.id)
    now = timezone.now()
    info: dict[str, dict[str, Any]] = {}
    for name, wanted in by_model.items():
        model = CatalogueModel.objects.filter(name=name).first()
        if model is None:
            continue
        ranked, throughput = model_ranking(model=model, now=now)
        starts = policy.start_estimates(ranked, throughput)
        for position, candidate in enumerate(ranked, start=1):
            if candidate.batch_id in wanted:
                wait = starts.get(candidate.batch_id, 0.0)
                info[candidate.batch_id] = {
                    "position": position,
                    "runnable_batches": len(ranked),
                    "estimated_start_at": int(now.timestamp() + wait) if wait != float("inf") else None,
                    "deadline_at_risk": policy.deadline_at_risk(candidate, now.timestamp(), policy_config()),
                }
    return info


# The admin's queue page (scheduling/admin.py): the queue per model and class, tenants' shares, and the
# batches at deadline risk. Read-only; the numbers come from the same rows and policy the claims use.

# "Served recently" on the queue page: work units of the shards claimed (started_at) in this window, as
# estimated at claim (what the claim charged to the tenant's virtual time).
RECENT_SERVED_WINDOW = timedelta(minutes=15)
# Rows of each model's serving order shown on the queue page (batches at deadline risk are all listed).
SERVING_ORDER_ROWS = 10


@dataclass(frozen=True)
class QueueClass:
    """One priority class of one model."""

    priority: str
    runnable_shards: int = 0
    runnable_lines: int = 0
    runnable_work: int = 0
    # Pending in a live batch but not runnable now: its tenant or model is paused, or it is deferred.
    held_shards: int = 0
    running_shards: int = 0
    # The oldest runnable batch's last claim (or when it became runnable); None when nothing is runnable.
    oldest_waiting_since: datetime | None = None
    oldest_wait_seconds: float | None = None


@dataclass(frozen=True)
class QueuePosition:
    """A runnable batch in its model's serving order: position 1 is what the next free slot claims."""

    position: int
    runnable_batches: int
    batch_id: str
    tenant_id: int
    tenant: str
    model: str
    priority: str
    tier: str
    effective_vtime: float
    remaining_work: float
    needed_seconds: float | None  # remaining work ÷ the model's throughput; None when that is unknown
    seconds_left: float  # until expires_at
    slack_seconds: float | None  # seconds_left - needed_seconds
    at_risk: bool


@dataclass(frozen=True)
class ModelQueue:
    id: int
    name: str
    paused: bool
    call_cap: int
    slot_cap: int
    queued_slots: int
    running_slots: int
    throughput: float  # work units per second with slot_cap slots; 0 = unknown
    classes: list[QueueClass]
    runnable_batches: int
    serving: list[QueuePosition]  # the head of the serving order

    @property
    def idle(self) -> bool:
        """No pending or running shard and no slot: the page shows one line for it."""
        busy = any(c.runnable_shards or c.held_shards or c.running_shards for c in self.classes)
        return not busy and not self.queued_slots and not self.running_slots


@dataclass(frozen=True)
class TenantQueue:
    id: int
    name: str
    paused: bool
    weight: float
    weight_share: float | None  # weight ÷ the weights of tenants with runnable work; None when it has none
    recent_work: int  # work units claimed in RECENT_SERVED_WINDOW
    served_share: float | None  # recent_work ÷ that of every tenant listed; None when none served any
    served_total: float  # TenantShare.served_work_units: undecayed, since the tenant was first served
    effective_vtime: float
    runnable_shards: int
    runnable_work: int
    held_shards: int
    running_shards: int


@dataclass(frozen=True)
class QueueOverview:
    now: datetime
    fifo: bool
    system_vtime: float
    recent_window_minutes: int
    models: list[ModelQueue]
    tenants: list[TenantQueue]  # tenants with pending or running shards
    at_risk: list[QueuePosition]  # every runnable batch at deadline risk, least slack first


def _live_pending_q() -> Q:
    return Q(status=ShardStatus.PENDING, batch__status=BatchStatus.IN_PROGRESS, batch__stop_reason__isnull=True)


def queue_overview(*, now: datetime) -> QueueOverview:
    config = policy_config()
    runnable = runnable_q(now)
    class_rows = (
        Shard.objects.filter(status__in=SHARD_OPEN_STATUSES)
        .order_by()
        .values("batch__model", "batch__priority")
        .annotate(
            runnable=Count("id", filter=runnable),
            lines=Sum("request_count", filter=runnable),
            work=Sum("work_units", filter=runnable),
            waiting_since=Min(
                Coalesce("batch__last_dispatched_at", "batch__in_progress_at", "batch__created_at"), filter=runnable
            ),
            pending=Count("id", filter=_live_pending_q()),
            running=Count("id", filter=Q(status=ShardStatus.RUNNING)),
        )
    )
    by_model: dict[str, dict[str, dict[str, Any]]] = {}
    for row in class_rows:
        by_model.setdefault(row["batch__model"], {})[row["batch__priority"]] = row
    models = list(CatalogueModel.objects.filter(Q(is_enabled=True) | Q(name__in=by_model)).order_by("name"))
    slots: dict[tuple[int, str], int] = {
        (row["model_id"], row["state"]): row["n"]
        for row in Slot.objects.filter(expires_at__gte=now).values("model_id", "state").annotate(n=Count("id"))
    }
    rankings = {
        model.name: model_ranking(model=model, now=now)
        for model in models
        if not model.paused and any(row["runnable"] for row in by_model.get(model.name, {}).values())
    }
    tenants = _tenant_queues(now=now, paused_models=[m.name for m in models if m.paused], config=config)
    names = {t.id: t.name for t in tenants}
    vtimes = {t.id: t.effective_vtime for t in tenants}
    positions = {
        name: [_position(i, c, len(ranked), name, names, vtimes, now, config) for i, c in enumerate(ranked, start=1)]
        for name, (ranked, _) in rankings.items()
    }
    model_queues = []
    for model in models:
        slot_cap = model_slot_cap(model)
        model_queues.append(
            ModelQueue(
                id=model.id,
                name=model.name,
                paused=model.paused,
                call_cap=model_call_cap(model),
                slot_cap=slot_cap,
                queued_slots=slots.get((model.id, SlotState.QUEUED), 0),
                running_slots=slots.get((model.id, SlotState.RUNNING), 0),
                throughput=model_throughput(model, slot_cap),
                classes=[
                    _queue_class(p, by_model.get(model.name, {}).get(p), model.paused, now) for p in Priority.values
                ],
                runnable_batches=len(positions.get(model.name, [])),
                serving=positions.get(model.name, [])[:SERVING_ORDER_ROWS],
            )
        )
    at_risk = [p for ranked in positions.values() for p in ranked if p.at_risk]
    at_risk.sort(key=lambda p: (math.inf if p.slack_seconds is None else p.slack_seconds, p.batch_id))
    return QueueOverview(
        now=now,
        fifo=config.fifo,
        system_vtime=policy.decayed(system_clock(), now.timestamp(), config),
        recent_window_minutes=int(RECENT_SERVED_WINDOW.total_seconds() // 60),
        models=model_queues,
        tenants=tenants,
        at_risk=at_risk,
    )


def _queue_class(priority: str, row: dict[str, Any] | None, model_paused: bool, now: datetime) -> QueueClass:
    if row is None:
        return QueueClass(priority=priority)
    if model_paused:
        # runnable_q does not know the model is paused (runnable_shards does): all its pending work is held.
        return QueueClass(priority=priority, held_shards=row["pending"], running_shards=row["running"])
    since = row["waiting_since"]
    return QueueClass(
        priority=priority,
        runnable_shards=row["runnable"],
        runnable_lines=row["lines"] or 0,
        runnable_work=row["work"] or 0,
        held_shards=row["pending"] - row["runnable"],
        running_shards=row["running"],
        oldest_waiting_since=since,
        oldest_wait_seconds=(now - since).total_seconds() if since else None,
    )


def _position(
    position: int,
    candidate: policy.Candidate,
    runnable_batches: int,
    model: str,
    tenant_names: dict[int, str],
    vtimes: dict[int, float],
    now: datetime,
    config: policy.PolicyConfig,
) -> QueuePosition:
    now_ts = now.timestamp()
    known = candidate.throughput > 0
    slack = policy.slack(candidate, now_ts)
    return QueuePosition(
        position=position,
        runnable_batches=runnable_batches,
        batch_id=candidate.batch_id,
        tenant_id=candidate.tenant_id,
        tenant=tenant_names.get(candidate.tenant_id, str(candidate.tenant_id)),
        model=model,
        priority=candidate.priority.value,
        tier=policy.tier(candidate, now_ts, config).name.lower(),
        effective_vtime=vtimes.get(candidate.tenant_id, 0.0),
        remaining_work=candidate.remaining_work,
        needed_seconds=candidate.remaining_work / candidate.throughput if known else None,
        seconds_left=candidate.expires_at - now_ts,
        slack_seconds=None if math.isinf(slack) else slack,
        at_risk=policy.deadline_at_risk(candidate, now_ts, config),
    )


def _tenant_queues(*, now: datetime, paused_models: list[str], config: policy.PolicyConfig) -> list[TenantQueue]:
    """Tenants with pending or running shards: their runnable work, weight and served share, virtual time."""
    runnable = runnable_q(now)
    if paused_models:
        runnable &= ~Q(batch__model__in=paused_models)
    rows = {
        row["batch__tenant_id"]: row
        for row in Shard.objects.filter(status__in=SHARD_OPEN_STATUSES)
        .order_by()
        .values("batch__tenant_id")
        .annotate(
            runnable=Count("id", filter=runnable),
            work=Sum("work_units", filter=runnable),
            pending=Count("id", filter=_live_pending_q()),
            running=Count("id", filter=Q(status=ShardStatus.RUNNING)),
        )
        if row["pending"] or row["running"]
    }
    recent = dict(
        Shard.objects.filter(batch__tenant_id__in=rows, started_at__gte=now - RECENT_SERVED_WINDOW)
        .order_by()
        .values("batch__tenant_id")
        .annotate(work=Sum("work_units"))
        .values_list("batch__tenant_id", "work")
    )
    served_total = dict(TenantShare.objects.filter(tenant_id__in=rows).values_list("tenant_id", "served_work_units"))
    shares, system = tenant_shares(rows), system_clock()
    tenants = list(Tenant.objects.filter(id__in=rows).order_by("name").values("id", "name", "paused", "weight"))
    backlogged_weight = sum(t["weight"] for t in tenants if rows[t["id"]]["runnable"])
    recent_total = sum(recent.get(t["id"]) or 0 for t in tenants)
    out = []
    for t in tenants:
        row, served = rows[t["id"]], recent.get(t["id"]) or 0
        out.append(
            TenantQueue(
                id=t["id"],
                name=t["name"],
                paused=t["paused"],
                weight=t["weight"],
                weight_share=t["weight"] / backlogged_weight if row["runnable"] and backlogged_weight > 0 else None,
                recent_work=served,
                served_share=served / recent_total if recent_total else None,
                served_total=served_total.get(t["id"], 0.0),
                effective_vtime=policy.effective_vtime(shares.get(t["id"]), system, now.timestamp(), config),
                runnable_shards=row["runnable"],
                runnable_work=row["work"] or 0,
                held_shards=row["pending"] - row["runnable"],
                running_shards=row["running"],
            )
        )
    return out
