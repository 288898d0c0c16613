"""The per-tenant monthly spend cap, checked when a batch is created (batches/intake/admission.py)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from controlplane.core.http.errors import QuotaExceeded
from controlplane.tenants.models import Tenant
from controlplane.usage.models import DEFAULT_CURRENCY
from controlplane.usage.selectors import month_start, tenant_month_to_date_cost


class SpendCapExceeded(QuotaExceeded):
    """A 429 whose body names the cap with its amounts (decimal strings, like OpenAI's cost amounts)."""

    def __init__(self, *, cap: Decimal, spent: Decimal, retry_after: float) -> None:
        super().__init__(
            f"The tenant's monthly spend cap of {cap:.2f} {DEFAULT_CURRENCY} is reached: {spent:.2f} "
            f"{DEFAULT_CURRENCY} spent this month (UTC). New batches are refused until the cap is raised "
            "or the month ends; running batches continue.",
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
