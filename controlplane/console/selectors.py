"""Reads for the dashboards: the stored samples of a window, bucketed in the database to at most
MAX_POINTS points per line, as chart series; and the usage ledger's cost per tenant per day as bars."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Avg, BigIntegerField, ExpressionWrapper, F, Max, Sum, Value

from controlplane.console.models import ModelSample, ServerSample
from controlplane.console.svg import BarGroup, Series
from controlplane.usage.selectors import cost_by_tenant_per_day

# The windows the dashboard offers, by their URL value (?window=6h).
WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
}
DEFAULT_WINDOW = "1h"
# Points per line at most: ~5 px apart on a 720 px chart; 7 d of 15 s samples become 84-minute buckets.
MAX_POINTS = 120


@dataclass(frozen=True)
class Dashboard:
    window: str
    start: datetime
    end: datetime
    bucket_seconds: int
    queue_lines: list[Series]
    throughput: list[Series]
    latency: dict[str, list[Series]]  # per model: p50, p95, p99
    slot_utilisation: list[Series]
    instances: list[Series]
    gpu_utilisation: list[Series]
    cost_currency: str
    cost: list[BarGroup]


def bucket_seconds_for(window: timedelta) -> int:
    """Bucket width: the window over MAX_POINTS, never finer than one sample interval."""
    interval = math.ceil(settings.CONSOLE_SAMPLES_INTERVAL_SECONDS)
    return max(interval, math.ceil(window.total_seconds() / MAX_POINTS))


def _bucketed(model: type[ModelSample] | type[ServerSample], start: datetime, end: datetime, bucket: int) -> Any:
    # Integer division on an integer column: the same bucketing SQL on Postgres and SQLite.
    expr = ExpressionWrapper(F("epoch") / Value(bucket) * Value(bucket), output_field=BigIntegerField())
    return (
        model.objects.filter(epoch__gte=int(start.timestamp()), epoch__lte=int(end.timestamp()))
        .order_by()
        .annotate(bucket=expr)
    )


def _series(rows: list[dict[str, Any]], key: str, value: Any) -> list[Series]:
    """One series per distinct rows[key], points (bucket, value(row)) in bucket order."""
    points: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: (r[key], r["bucket"])):
        points[row[key]].append((float(row["bucket"]), value(row)))
    return [Series(name=name, points=tuple(pts)) for name, pts in sorted(points.items())]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if not denominator else float(numerator or 0) / float(denominator)


def dashboard(*, window: str, now: datetime) -> Dashboard:
    span = WINDOWS[window]
    start, bucket = now - span, bucket_seconds_for(span)
    model_rows = list(
        _bucketed(ModelSample, start, now, bucket)
        .values("bucket", "model")
        .annotate(
            runnable_lines=Avg("runnable_lines"),
            completed=Sum("lines_completed"),
            failed=Sum("lines_failed"),
            seconds=Sum("interval_seconds"),
            shards=Sum("shards_finished"),
            # Within a bucket the worst interval's percentile: percentiles of intervals cannot be averaged.
            p50=Max("shard_p50_seconds"),
            p95=Max("shard_p95_seconds"),
            p99=Max("shard_p99_seconds"),
            instances=Avg("instances"),
            slots_running=Sum("slots_running"),
            slot_cap=Sum("slot_cap"),
        )
    )
    latency: dict[str, list[Series]] = {}
    for model in sorted({r["model"] for r in model_rows if r["shards"]}):
        rows = [r for r in model_rows if r["model"] == model]
        latency[model] = [
            Series(name=q, points=tuple((float(r["bucket"]), r[q]) for r in sorted(rows, key=lambda r: r["bucket"])))
            for q in ("p50", "p95", "p99")
        ]
    server_rows = list(
        _bucketed(ServerSample, start, now, bucket)
        .values("bucket", "server")
        .annotate(gpu=Avg("gpu_utilization"), instances=Avg("instances"))
    )
    currency, cost = _cost_bars(start=start, end=now)
    return Dashboard(
        window=window,
        start=start,
        end=now,
        bucket_seconds=bucket,
        queue_lines=_series(model_rows, "model", lambda r: float(r["runnable_lines"] or 0)),
        throughput=_series(model_rows, "model", lambda r: _ratio(r["completed"] + r["failed"], r["seconds"])),
        latency=latency,
        slot_utilisation=_series(
            model_rows, "model", lambda r: None if not r["slot_cap"] else 100 * r["slots_running"] / r["slot_cap"]
        ),
        instances=_series(model_rows, "model", lambda r: float(r["instances"] or 0)),
        gpu_utilisation=[
            s
            for s in _series(server_rows, "server", lambda r: None if r["gpu"] is None else 100 * r["gpu"])
            if any(y is not None for _, y in s.points)
        ],
        cost_currency=currency,
        cost=cost,
    )


def _cost_bars(*, start: datetime, end: datetime) -> tuple[str, list[BarGroup]]:
    """Cost per tenant per day (summed over models) for the days the window touches, from the usage ledger."""
    first, last = start.date(), end.date()
    per_day: dict[str, dict[str, Decimal]] = {}
    currencies: set[str] = set()
    for row in cost_by_tenant_per_day(start=first, end=last + timedelta(days=1)):
        day = per_day.setdefault(row.day.isoformat(), {})
        day[row.tenant_name] = day.get(row.tenant_name, Decimal(0)) + row.amount
        currencies.add(row.currency)
    days = [(first + timedelta(days=i)).isoformat() for i in range((last - first).days + 1)]
    groups = [
        BarGroup(label=day, values=tuple((t, float(v)) for t, v in sorted(per_day.get(day, {}).items())))
        for day in days
    ]
    # One currency is the norm (prices are set in one); several are listed together rather than converted.
    return ", ".join(sorted(currencies)) or "", groups if per_day else []
