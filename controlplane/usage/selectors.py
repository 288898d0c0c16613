"""Reads of the usage ledger: operators' daily views (cost per tenant and model, idle capacity), a batch's
cost and a tenant's month to date. The tenant reports in OpenAI's shapes are in usage/reports.py."""

from __future__ import annotations

import datetime
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Q, Sum
from django.db.models.functions import TruncDate

from controlplane.usage.models import DEFAULT_CURRENCY, CapacityInterval, Price, UsageRecord


@dataclass(frozen=True)
class DailyCost:
    day: datetime.date
    tenant_id: str
    tenant_name: str
    model: str
    amount: Decimal
    currency: str


@dataclass(frozen=True)
class IdleCapacity:
    day: datetime.date
    instance_seconds: float
    attributed_seconds: float

    @property
    def idle_seconds(self) -> float:
        # Dispatch-time fallbacks (no statistics) can exceed what the placements offered: never below 0.
        return max(0.0, self.instance_seconds - self.attributed_seconds)


def _day_start(day: datetime.date) -> datetime.datetime:
    return datetime.datetime.combine(day, datetime.time.min, tzinfo=datetime.UTC)


def cost_by_tenant_per_day(*, start: datetime.date, end: datetime.date) -> list[DailyCost]:
    """Charged cost per UTC day, tenant and model for ``start`` ≤ day < ``end``, ordered by day, tenant, model."""
    rows = (
        UsageRecord.objects.filter(finished_at__gte=_day_start(start), finished_at__lt=_day_start(end))
        .annotate(day=TruncDate("finished_at"))
        .values("day", "tenant_id", "tenant__name", "model", "currency")
        .annotate(amount=Sum("cost"))
        .order_by("day", "tenant__name", "model", "currency")
    )
    return [
        DailyCost(
            day=row["day"],
            tenant_id=str(row["tenant_id"]),
            tenant_name=row["tenant__name"],
            model=row["model"],
            amount=row["amount"] or Decimal(0),
            currency=row["currency"],
        )
        for row in rows
    ]


def idle_capacity_per_day(*, start: datetime.date, end: datetime.date) -> list[IdleCapacity]:
    """Per UTC day in [start, end): instance-seconds the placements offered and compute seconds attributed
    to tenants' shards; only days with either are listed."""
    window = Q(ended_at__gte=_day_start(start), ended_at__lt=_day_start(end))
    offered: dict[datetime.date, float] = defaultdict(float)
    for row in (
        CapacityInterval.objects.filter(window)
        .annotate(day=TruncDate("ended_at"))
        .values("day")
        .annotate(total=Sum("instance_seconds"))
    ):
        offered[row["day"]] += row["total"] or 0.0
    attributed: dict[datetime.date, float] = defaultdict(float)
    for row in (
        UsageRecord.objects.filter(finished_at__gte=_day_start(start), finished_at__lt=_day_start(end))
        .annotate(day=TruncDate("finished_at"))
        .values("day")
        .annotate(total=Sum("compute_seconds"))
    ):
        attributed[row["day"]] += row["total"] or 0.0
    return [
        IdleCapacity(day=day, instance_seconds=offered.get(day, 0.0), attributed_seconds=attributed.get(day, 0.0))
        for day in sorted(set(offered) | set(attributed))
    ]


@dataclass(frozen=True)
class Amount:
    value: Decimal
    currency: str


def batch_cost(*, batch_id: str) -> Amount:
    """What a batch has been charged so far (its shards' ledger rows)."""
    total = UsageRecord.objects.filter(batch_id=batch_id).aggregate(total=Sum("cost"))["total"]
    return Amount(value=total or Decimal(0), currency=DEFAULT_CURRENCY)


def batch_costs(*, batch_ids: list[str]) -> dict[str, Amount]:
    """``batch_cost`` for many batches in one query (a page of the batch list)."""
    totals = {
        row["batch_id"]: row["total"]
        for row in UsageRecord.objects.filter(batch_id__in=batch_ids).values("batch_id").annotate(total=Sum("cost"))
    }
    return {
        batch_id: Amount(value=totals.get(batch_id) or Decimal(0), currency=DEFAULT_CURRENCY) for batch_id in batch_ids
    }


def month_start(now: datetime.datetime) -> datetime.datetime:
    """The first instant of ``now``'s calendar month, UTC: spend caps are monthly."""
    utc = now.astimezone(datetime.UTC)
    return utc.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def tenant_month_to_date_cost(*, tenant_id: int, now: datetime.datetime) -> Decimal:
    total = UsageRecord.objects.filter(tenant_id=tenant_id, finished_at__gte=month_start(now)).aggregate(
        total=Sum("cost")
    )["total"]
    return total or Decimal(0)


def price_in_force(*, model_name: str, at: datetime.datetime) -> Price | None:
    """The model's newest price with ``effective_from`` ≤ ``at``; None when it has none (free)."""
    return Price.objects.filter(model__name=model_name, effective_from__lte=at).order_by("-effective_from").first()
