"""Claiming the next shard of a model by policy, and charging it to the tenant's fair share.

A claim is one transaction: rank the model's runnable batches (policy.py), then take the lowest pending
shard of the best batch with ``SELECT … FOR UPDATE SKIP LOCKED`` — two claimers never get one shard, and
neither waits on the other's row. The claimed work is charged to the tenant's virtual time at claim
(estimated work units) and corrected when the shard settles (measured tokens)."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.batches.models import Batch, Shard, ShardStatus
from controlplane.batches.pinning import pinned_model
from controlplane.batches.shards import shard_claim_selected
from controlplane.batches.transitions import event_record
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import TokenCounts
from controlplane.kinds.registry import kind_for
from controlplane.scheduling import policy, selectors
from controlplane.scheduling.models import SchedulerClock, TenantShare

# Smoothing of the measured seconds per work unit, and the most one shard may move it: a cold start
# (a model loading under the first shard) must not make every later shard four lines long.
SPEED_SMOOTHING = 0.3
SPEED_STEP_LIMIT = 4.0


def shard_claim_next(*, model: CatalogueModel, owner: str) -> Shard | None:
    """Claim the shard the policy serves next for this model; None when nothing of it is runnable."""
    now = timezone.now()
    with transaction.atomic():
        ranked, _ = selectors.model_ranking(model=model, now=now)
        for candidate in ranked:
            shard_id = (
                # OF self: without it Postgres also locks (and skips on) the joined batch and tenant rows,
                # so a batch whose row is busy (a commit updating its counts) would look empty.
                Shard.objects.select_for_update(skip_locked=True, of=("self",))
                .filter(selectors.runnable_q(now), batch_id=candidate.batch_id)
                .order_by("index")
                .values_list("id", flat=True)
                .first()
            )
            if shard_id is None:
                continue  # its shards were claimed by someone else since the ranking was read
            shard = shard_claim_selected(shard_id=shard_id, owner=owner, now=now)
            if shard is None:
                continue  # no longer pending (SQLite has no row locks to keep it so)
            _charge(tenant_id=shard.batch.tenant_id, weight=shard.batch.tenant.weight, work=shard.work_units, now=now)
            promote = not candidate.deadline_promoted and policy.deadline_at_risk(
                candidate, now.timestamp(), selectors.policy_config()
            )
            break
        else:
            return None
    # After the commit: a cancel locks the batch row and then the batch's pending shards, so taking the
    # batch row while holding a shard lock could deadlock with it. Aging needs no more precision than this.
    stamps = {"last_dispatched_at": now, **({"deadline_promoted_at": now} if promote else {})}
    Batch.objects.filter(id=shard.batch_id).update(**stamps)
    if promote:
        event_record(
            batch_id=shard.batch_id,
            kind="deadline_promoted",
            message="remaining work needs more than the allowed share of the time left",
        )
    return shard


def _charge(*, tenant_id: int, weight: float, work: float, now: datetime) -> None:
    """Advance the tenant's virtual time by the claimed work (locks: share row, then the clock row)."""
    config = selectors.policy_config()
    share_row, new_tenant = TenantShare.objects.select_for_update().get_or_create(
        tenant_id=tenant_id, defaults={"vtime": 0.0, "vtime_at": now}
    )
    clock_row, _ = SchedulerClock.objects.select_for_update().get_or_create(
        name="default", defaults={"vtime": 0.0, "vtime_at": now}
    )
    # A tenant without a share row yet is new to the scheduler: the policy starts it at the system clock.
    existing = (
        None
        if new_tenant
        else policy.TenantShare(
            tenant_id=tenant_id, clock=policy.Clock(share_row.vtime, share_row.vtime_at.timestamp()), weight=weight
        )
    )
    system = policy.Clock(clock_row.vtime, clock_row.vtime_at.timestamp())
    new_share, new_system = policy.charge(existing, tenant_id, max(weight, 1e-6), system, work, now.timestamp(), config)
    TenantShare.objects.filter(tenant_id=tenant_id).update(
        vtime=new_share.clock.vtime, vtime_at=now, served_work_units=F("served_work_units") + work
    )
    SchedulerClock.objects.filter(name="default").update(vtime=new_system.vtime, vtime_at=now)


def shard_settle(*, shard_id: int, cycle_seconds: float | None = None, model_seconds: float | None = None) -> None:
    """After a shard committed: correct the tenant's charge with the measured work (the tokenizer's count
    for text) and fold the shard's measured seconds per work unit into the model's estimate. ``cycle_seconds``
    is what the shard cost its slot, claim and commit included (the slot runner measures it): a slot's
    throughput is shards per cycle, and with small shards the claim and commit are a large part of it (an
    e2e deadline test saw promotions come too late when only started → finished was counted). ``model_seconds``
    is how long its Triton calls were in flight (scheduling/call_clock.py), folded into the figure shards are cut
    by (None: not timed, that figure is left alone)."""
    row = (
        Shard.objects.filter(id=shard_id, status=ShardStatus.SUCCEEDED)
        .values(
            "work_units",
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "completion_choices",
            "started_at",
            "finished_at",
            "batch__endpoint",
            "batch__tenant_id",
            "batch__tenant__weight",
            "batch__model",
            "batch__model_snapshot",
        )
        .first()
    )
    if row is None or not row["work_units"]:
        return
    counts = TokenCounts(
        row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"], row["completion_choices"]
    )
    snapshot = row["batch__model_snapshot"]
    measured = kind_for(row["batch__endpoint"]).measured_work_units(
        estimated=row["work_units"], measured=counts, model=pinned_model(snapshot) if snapshot else None
    )
    now = timezone.now()
    if measured != row["work_units"]:
        with transaction.atomic():
            share_row = TenantShare.objects.select_for_update().filter(tenant_id=row["batch__tenant_id"]).first()
            if share_row is not None:
                share = policy.TenantShare(
                    tenant_id=share_row.tenant_id,
                    clock=policy.Clock(share_row.vtime, share_row.vtime_at.timestamp()),
                    weight=max(row["batch__tenant__weight"], 1e-6),
                )
                corrected = policy.correct(
                    share, measured - row["work_units"], now.timestamp(), selectors.policy_config()
                )
                TenantShare.objects.filter(tenant_id=share_row.tenant_id).update(
                    vtime=corrected.clock.vtime,
                    vtime_at=now,
                    served_work_units=F("served_work_units") + (measured - row["work_units"]),
                )
    seconds = cycle_seconds
    if seconds is None and row["started_at"] and row["finished_at"]:
        seconds = (row["finished_at"] - row["started_at"]).total_seconds()
    samples = {}  # estimate → this shard's seconds per unit: the slot's cycle, and its calls' time
    if seconds is not None:
        samples["seconds_per_work_unit"] = seconds / measured
    if model_seconds is not None:
        samples["model_seconds_per_work_unit"] = model_seconds / measured
    _speed_update(model_name=row["batch__model"], samples=samples)
    if counts.choices:
        _completion_update(model_name=row["batch__model"], tokens_per_choice=counts.output / counts.choices)


def _speed_update(*, model_name: str, samples: dict[str, float]) -> None:
    """Fold one shard's seconds per unit into each named estimate of the model (one read, one write)."""
    samples = {field: value for field, value in samples.items() if value > 0}
    if not samples:
        return
    model = CatalogueModel.objects.filter(name=model_name).only("id", *samples).first()
    if model is None:
        return
    updates = {}
    for field, value in samples.items():
        old = getattr(model, field)
        if old > 0:
            value = min(max(value, old / SPEED_STEP_LIMIT), old * SPEED_STEP_LIMIT)
            value = SPEED_SMOOTHING * value + (1 - SPEED_SMOOTHING) * old
        updates[field] = value
    CatalogueModel.objects.filter(id=model.id).update(**updates)


def _completion_update(*, model_name: str, tokens_per_choice: float) -> None:
    """Fold a shard's mean completion per choice into the model's expected completion (generation estimates,
    kinds/generation/kind.py): smoothed like the speed, with no step limit (a count of tokens, not a timing: a
    batch of short answers after long ones should be believed at once, up to the smoothing)."""
    model = CatalogueModel.objects.filter(name=model_name).only("id", "expected_completion_tokens").first()
    if model is None:
        return
    old = model.expected_completion_tokens
    expected = tokens_per_choice if old is None else SPEED_SMOOTHING * tokens_per_choice + (1 - SPEED_SMOOTHING) * old
    CatalogueModel.objects.filter(id=model.id).update(expected_completion_tokens=expected)
