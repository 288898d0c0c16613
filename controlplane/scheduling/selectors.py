"""Reads of the scheduler: what is runnable per model (as policy candidates), tenants' virtual times,
each model's slot capacity, and a batch's place in its model's queue."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Sum
from django.db.models.expressions import RawSQL
from django.utils import timezone

from controlplane.batches.models import RUNNABLE_BATCH_STATUSES, Batch, BatchStatus, Shard, ShardStatus
from controlplane.fleet.models import CatalogueModel
from controlplane.fleet.selectors import fleet_is_managed, model_ready_instances
from controlplane.scheduling import policy
from controlplane.scheduling.models import SchedulerClock, TenantShare
from controlplane.tenants.models import Tenant


def policy_config() -> policy.PolicyConfig:
    return policy.PolicyConfig(
        aging_seconds=settings.SCHEDULER_AGING_SECONDS,
        half_life_seconds=settings.SCHEDULER_HALF_LIFE_SECONDS,
        deadline_fraction=settings.SCHEDULER_DEADLINE_FRACTION,
        fifo=settings.SCHEDULER_POLICY == "fifo",
    )


def runnable_q(now: datetime) -> Q:
    """A pending shard may be claimed: its batch runs, nobody paused it, its tenant is under its spend cap, and any
    deferral has passed; a validating batch's only on spare capacity (_early_dispatch_q)."""
    return Q(
        _early_dispatch_q(now), status=ShardStatus.PENDING, batch__status__in=RUNNABLE_BATCH_STATUSES
    ) & _claimable_q(now)


def _claimable_q(now: datetime) -> Q:
    """What else a pending shard needs to be claimed, beside its status and its batch's."""
    return Q(
        batch__stop_reason__isnull=True,
        batch__tenant__paused=False,
        # A column kept current on beat (usage/spendcap.spend_caps_refresh), not the ledger's sum: the ledger also
        # changes after commit (attribution), and a grouped read every few seconds costs less than a sum per claim.
        batch__tenant__spend_capped_at__isnull=True,
    ) & (Q(not_before__isnull=True) | Q(not_before__lte=now))


def _early_dispatch_q(now: datetime) -> Q:
    """A validating batch's shards run early (BATCH_EARLY_DISPATCH) on capacity no valid batch wants: its file may
    still prove invalid, and its validation already takes a core. So none is claimed while a batch of its model that
    has passed validation has a shard running or one that its tenant may run (deferred ones included: they run
    within seconds), and at most BATCH_EARLY_DISPATCH_MAX_RUNNING at once otherwise: a newcomer then waits for that
    many in-flight shards at most, not for every worker process (bench/validation_abuse.py: another tenant's small
    batch 1.6-2x slower beside them without these rules). Decided per validating batch (a few), not per pending
    shard (a 5M-line file has ~1,200): the database evaluates the IN list once per query."""
    return ~Q(batch__status=BatchStatus.VALIDATING) | Q(
        batch_id__in=RawSQL(
            _EARLY_BATCHES_SQL,
            (
                BatchStatus.VALIDATING,
                BatchStatus.IN_PROGRESS,
                ShardStatus.RUNNING,
                ShardStatus.PENDING,
                ShardStatus.RUNNING,
                settings.BATCH_EARLY_DISPATCH_MAX_RUNNING,
            ),
        )
    )


# _early_dispatch_q's validating batches that may run a shard now. SQL, not the ORM's nested querysets: compiling
# those took ~2 ms per runnable query, and a claim builds two (2,000 claims ran 23 % slower).
_EARLY_BATCHES_SQL = f"""
    SELECT v.id FROM {Batch._meta.db_table} v
    WHERE v.status = %s
      AND NOT EXISTS (
        SELECT 1 FROM {Shard._meta.db_table} s
        JOIN {Batch._meta.db_table} b ON b.id = s.batch_id
        JOIN {Tenant._meta.db_table} t ON t.id = b.tenant_id
        WHERE b.model = v.model AND b.status = %s
          AND (s.status = %s OR (s.status = %s AND b.stop_reason IS NULL AND NOT t.paused AND t.spend_capped_at IS NULL))
      )
      AND (SELECT count(*) FROM {Shard._meta.db_table} r WHERE r.batch_id = v.id AND r.status = %s) < %s
"""  # table names from the models, every value a parameter


def runnable_shards(*, model: CatalogueModel, now: datetime) -> QuerySet[Shard]:
    if model.paused:
        return Shard.objects.none()
    return Shard.objects.filter(runnable_q(now), batch__model=model.name)


def models_with_runnable_shards(models: QuerySet[CatalogueModel], now: datetime) -> QuerySet[CatalogueModel]:
    """Those of ``models`` that have a shard to claim now, paused models included: one query, whose EXISTS stops
    at each model's first runnable shard (a slot's end tops its model up: a scan of every pending shard of a
    large batch there halved the hot path's lines/s)."""
    runnable = Shard.objects.filter(runnable_q(now), batch__model=OuterRef("name"))
    return models.filter(Exists(runnable))


def model_call_cap(model: CatalogueModel) -> int:
    """Triton calls in flight the model may have across the fleet: the catalogue's cap, or a default
    per ready instance (unmanaged: per configured server, one instance each)."""
    if model.max_inflight_calls:
        return model.max_inflight_calls
    instances = model_ready_instances(model=model) if fleet_is_managed() else len(settings.TRITON_GRPC_URLS)
    return instances * settings.SCHEDULER_CALLS_PER_INSTANCE


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
            "batch_id",
            "batch__tenant_id",
            "batch__priority",
            "batch__created_at",
            "batch__last_dispatched_at",
            "batch__in_progress_at",
            "batch__expires_at",
            "batch__deadline_promoted_at",
        )
        .annotate(work=Sum("work_units"), shards=Count("id"))
    )
    remaining = _remaining_work([row["batch_id"] for row in rows])
    return [
        policy.Candidate(
            batch_id=row["batch_id"],
            tenant_id=row["batch__tenant_id"],
            priority=policy.Priority(row["batch__priority"]),
            created_at=row["batch__created_at"].timestamp(),
            waiting_since=_ts(
                row["batch__last_dispatched_at"] or row["batch__in_progress_at"], row["batch__created_at"]
            ),
            expires_at=row["batch__expires_at"].timestamp(),
            remaining_work=float(remaining.get(row["batch_id"], row["work"] or 0)),
            throughput=throughput,
            next_shard_work=float(row["work"] or 0) / max(1, row["shards"]),
            deadline_promoted=row["batch__deadline_promoted_at"] is not None,
        )
        for row in rows
    ]


def _remaining_work(batch_ids: list[str]) -> dict[str, int]:
    """Work units of each batch still pending or running (deadline risk counts both)."""
    if not batch_ids:
        return {}
    rows = (
        Shard.objects.filter(batch_id__in=batch_ids, status__in=(ShardStatus.PENDING, ShardStatus.RUNNING))
        .values("batch_id")
        .annotate(work=Sum("work_units"))
    )
    return {row["batch_id"]: int(row["work"] or 0) for row in rows}


def tenant_shares(tenant_ids: Iterable[int]) -> dict[int, policy.TenantShare]:
    rows = TenantShare.objects.filter(tenant_id__in=set(tenant_ids)).values(
        "tenant_id", "vtime", "vtime_at", "tenant__weight"
    )
    return {
        row["tenant_id"]: policy.TenantShare(
            tenant_id=row["tenant_id"],
            clock=policy.Clock(row["vtime"], row["vtime_at"].timestamp()),
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
    if len(candidates) < 2:  # rank never drops one: a lone batch needs no shares or clock (two queries a claim)
        return candidates, throughput
    shares = tenant_shares(c.tenant_id for c in candidates)
    ranked = policy.rank(candidates, shares, system_clock(), now.timestamp(), policy_config())
    return ranked, throughput


# What polling clients are shown is recomputed at most once a second per model and process: a ranking is ~6
# queries and was over half of a batch retrieve's CPU, which SDK clients call in a loop while a batch runs. A
# batch missing from the cached ranking (it just became runnable) has it recomputed at once.
QUEUE_INFO_TTL_SECONDS = 1.0
_rankings: dict[str, tuple[float, list[policy.Candidate], float]] = {}


def _shown_ranking(model: CatalogueModel, now: datetime, wanted: set[str]) -> tuple[list[policy.Candidate], float]:
    cached = _rankings.get(model.name)
    if (
        cached is not None
        and time.monotonic() - cached[0] < QUEUE_INFO_TTL_SECONDS
        and wanted <= {candidate.batch_id for candidate in cached[1]}
    ):
        return cached[1], cached[2]
    ranked, throughput = model_ranking(model=model, now=now)
    _rankings[model.name] = (time.monotonic(), ranked, throughput)
    return ranked, throughput


def batches_queue_info(batches: Iterable[Batch]) -> dict[str, dict[str, Any]]:
    """For in_progress batches with runnable shards: their position among the model's runnable batches
    (1 = served by the next free slot) and an estimated start of their next shard (positions may be up
    to QUEUE_INFO_TTL_SECONDS old)."""
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
        ranked, throughput = _shown_ranking(model, now, set(wanted))
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
