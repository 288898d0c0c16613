"""The per-tenant monthly spend cap: checked when a batch is created (batches/intake/admission.py), at each shard's
commit for a tenant with a cap (``spend_cap_mark``: the charge that reaches the cap marks the tenant in the same
transaction, so no shard is claimed for it after that one), and on beat while batches run (``spend_caps_refresh``:
the mark the scheduler's claim reads, set and cleared; batches.services ends the capped tenants' running
batches)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Q, Sum

from controlplane.core.http.errors import QuotaExceeded
from controlplane.tenants.models import Tenant
from controlplane.usage.models import DEFAULT_CURRENCY, UsageRecord
from controlplane.usage.selectors import month_start, tenant_month_to_date_cost


class SpendCapExceeded(QuotaExceeded):
    """A 429 whose body names the cap with its amounts (decimal strings, like OpenAI's cost amounts)."""

    def __init__(self, *, cap: Decimal, spent: Decimal, retry_after: float) -> None:
        super().__init__(
            f"The tenant's monthly spend cap of {cap:.2f} {DEFAULT_CURRENCY} is reached: {spent:.2f} "
            f"{DEFAULT_CURRENCY} spent this month (UTC). New batches are refused until the cap is raised "
            "or the month ends; running batches stop, their unfinished requests answered as spend_cap_exceeded.",
            code="spend_cap_exceeded",
            limit="monthly_spend_cap",
            retry_after=retry_after,
            # The openai SDK would retry a 429 by itself; a cap does not lift within its retries.
            headers={"x-should-retry": "false"},
        )
        self.cap = cap
        self.spent = spent

    def limit_body(self) -> dict[str, Any] | None:
        return {
            "name": "monthly_spend_cap",
            "value": f"{self.cap:.2f}",
            "current": f"{self.spent:.2f}",
            "currency": DEFAULT_CURRENCY,
        }


def _next_month(now: datetime) -> datetime:
    start = month_start(now)
    return start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)


def spend_cap_enforce(*, tenant: Tenant, now: datetime) -> None:
    """Raise SpendCapExceeded when the tenant has a cap and its month-to-date cost is at or over it."""
    cap = tenant.monthly_spend_cap
    if cap is None:
        return
    spent = tenant_month_to_date_cost(tenant_id=tenant.id, now=now)
    if spent >= cap:
        raise SpendCapExceeded(cap=cap, spent=spent, retry_after=(_next_month(now) - now).total_seconds())


def spend_cap_mark(*, tenant_id: int, now: datetime) -> bool:
    """After a charge to ``tenant_id``: mark the tenant capped when it has a cap, is not marked yet and its
    month-to-date cost reached the cap; whether it was marked. A tenant without a cap costs one primary-key read.
    Without it, shards went on being claimed for a tenant over its cap until beat's next refresh."""
    cap = (
        Tenant.objects.filter(id=tenant_id, monthly_spend_cap__isnull=False, spend_capped_at__isnull=True)
        .values_list("monthly_spend_cap", flat=True)
        .first()
    )
    if cap is None or tenant_month_to_date_cost(tenant_id=tenant_id, now=now) < cap:
        return False
    return bool(Tenant.objects.filter(id=tenant_id, spend_capped_at__isnull=True).update(spend_capped_at=now))


@dataclass(frozen=True)
class CapReached:
    """A tenant at or over its monthly cap: the cap and what the ledger holds for the month."""

    tenant_id: int
    cap: Decimal
    spent: Decimal

    def message(self) -> str:
        return (
            f"The tenant's monthly spend cap of {self.cap:.2f} {DEFAULT_CURRENCY} was reached ({self.spent:.2f} "
            f"{DEFAULT_CURRENCY} spent this month, UTC) before this request ran; raise the cap or wait for the "
            "next month, then re-run the failed lines."
        )


def spend_caps_refresh(*, now: datetime) -> list[CapReached]:
    """Set ``Tenant.spend_capped_at`` on each tenant whose month-to-date cost is at or over its cap and clear it
    on the others (cap raised or removed, a new month); returns the tenants at their cap. One grouped read of the
    month's ledger for the tenants with a cap, then at most two UPDATEs."""
    caps: dict[int, Decimal] = {
        tenant_id: cap
        for tenant_id, cap in Tenant.objects.filter(monthly_spend_cap__isnull=False).values_list(
            "id", "monthly_spend_cap"
        )
        if cap is not None
    }
    spent = dict(
        UsageRecord.objects.filter(tenant_id__in=caps, finished_at__gte=month_start(now))
        .values("tenant_id")
        .annotate(total=Sum("cost"))
        .values_list("tenant_id", "total")
    )
    reached = [
        CapReached(tenant_id=tenant_id, cap=cap, spent=spent.get(tenant_id) or Decimal(0))
        for tenant_id, cap in sorted(caps.items())
        if (spent.get(tenant_id) or Decimal(0)) >= cap
    ]
    capped_ids = [r.tenant_id for r in reached]
    Tenant.objects.filter(id__in=capped_ids, spend_capped_at__isnull=True).update(spend_capped_at=now)
    Tenant.objects.filter(Q(spend_capped_at__isnull=False) & ~Q(id__in=capped_ids)).update(spend_capped_at=None)
    return reached
