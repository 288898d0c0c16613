"""Reads for the admin's queue page (scheduling/admin.py): the queue per model and class, tenants' shares,
and the batches at deadline risk. Read-only; the numbers come from the same rows and policy the claims use."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q, Sum
from django.db.models.functions import Coalesce

from controlplane.batches.models import RUNNABLE_BATCH_STATUSES, SHARD_OPEN_STATUSES, Shard, ShardStatus
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling import policy
from controlplane.scheduling.models import Slot, SlotState, TenantShare
from controlplane.scheduling.selectors import (
    model_call_cap,
    model_ranking,
    model_slot_cap,
    model_throughput,
    policy_config,
    runnable_q,
    system_clock,
    tenant_shares,
)
from controlplane.tenants.models import Priority, Tenant

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
    return Q(status=ShardStatus.PENDING, batch__status__in=RUNNABLE_BATCH_STATUSES, batch__stop_reason__isnull=True)


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
