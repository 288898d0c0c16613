"""Tenant reports in the shapes of OpenAI's organization usage and costs API: time buckets of
``bucket_width`` from ``start_time``, each with one result per group (``group_by``), paged by
``next_page``. Only the asking tenant's ledger rows are ever read."""

from __future__ import annotations

import datetime
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.utils import timezone

from controlplane.core.http.errors import ValidationFailed, quote
from controlplane.usage.models import DEFAULT_CURRENCY, UsageRecord
from controlplane.usage.rules import PriceTerms, shard_cost

BUCKET_SECONDS = {"1m": 60, "1h": 3600, "1d": 86400}
# OpenAI's defaults and maxima of ``limit`` (buckets per page) for each width.
BUCKET_LIMITS = {"1m": (60, 1440), "1h": (24, 168), "1d": (7, 31)}
# group_by values and the result field each one fills; OpenAI's names plus ``batch`` (an extension), with
# the short spellings accepted too.
GROUP_FIELDS = {
    "model": "model",
    "api_key_id": "api_key_id",
    "api_key": "api_key_id",
    "batch": "batch_id",
    "batch_id": "batch_id",
    "project_id": "project_id",
    "user_id": "user_id",
}
COST_GROUP_FIELDS = {**GROUP_FIELDS, "line_item": "line_item"}
# The kinds of usage report: the endpoints its ledger rows came from and the counters it sums (result field →
# ledger column; OpenAI's names, its audio counters always 0 here).
REPORT_KINDS: dict[str, tuple[tuple[str, ...], dict[str, str | None]]] = {
    "embeddings": (("/v1/embeddings",), {"input_tokens": "tokens"}),
    "tensors": (("/v2/infer",), {"rows": "rows"}),
    "completions": (
        ("/v1/chat/completions", "/v1/completions", "/v1/responses"),
        {
            "input_tokens": "tokens",
            "input_cached_tokens": "cached_tokens",
            "output_tokens": "output_tokens",
            "input_audio_tokens": None,
            "output_audio_tokens": None,
        },
    ),
}
PAGE_PREFIX = "page_"


def _many(params: Mapping[str, Any], name: str) -> list[str]:
    """An array parameter sent either way: repeated (``group_by=a&group_by=b``, the openai SDK's default)
    or with brackets (``group_by[]=a``, what its OpenAI client sends)."""
    getlist = getattr(params, "getlist", None)
    if getlist is None:
        value = params.get(name)
        return [] if value is None else [value] if isinstance(value, str) else list(value)
    values = [*getlist(name), *getlist(f"{name}[]")]
    # A comma-separated value is read as a list too (curl users write group_by=model,batch).
    return [part for value in values for part in value.split(",") if part]


def _unix(params: Mapping[str, Any], name: str) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ValidationFailed(f"{name} must be a Unix time in seconds, got {quote(raw)}.", param=name) from None
    if not 0 <= value < 2**33:  # beyond year 2242: a millisecond timestamp sent by mistake
        raise ValidationFailed(f"{name} must be a Unix time in seconds, got {value}.", param=name)
    return value


@dataclass(frozen=True)
class ReportQuery:
    start_time: int
    end_time: int
    bucket_width: str
    limit: int
    group_by: tuple[str, ...]  # result field names
    models: tuple[str, ...]
    api_key_ids: tuple[str, ...]
    page_start: int  # the first bucket of this page


def report_query_parse(params: Mapping[str, Any], *, costs: bool = False) -> ReportQuery:
    """Validate the query parameters; every problem is a ValidationFailed naming the parameter."""
    start = _unix(params, "start_time")
    if start is None:
        raise ValidationFailed("start_time is required (Unix seconds, inclusive).", param="start_time")
    end = _unix(params, "end_time")
    if end is None:
        end = int(timezone.now().timestamp()) + 1
    if end <= start:
        raise ValidationFailed(f"end_time ({end}) must be after start_time ({start}).", param="end_time")
    width = params.get("bucket_width") or "1d"
    if width not in BUCKET_SECONDS:
        raise ValidationFailed(f"bucket_width must be one of 1m, 1h, 1d, got {quote(width)}.", param="bucket_width")
    default_limit, max_limit = BUCKET_LIMITS[width]
    raw_limit = params.get("limit")
    try:
        limit = default_limit if raw_limit is None or raw_limit == "" else int(raw_limit)
    except (TypeError, ValueError):
        raise ValidationFailed(f"limit must be an integer, got {quote(raw_limit)}.", param="limit") from None
    if not 1 <= limit <= max_limit:
        raise ValidationFailed(f"limit must be between 1 and {max_limit} for bucket_width {width}.", param="limit")
    allowed = COST_GROUP_FIELDS if costs else GROUP_FIELDS
    fields = []
    for name in _many(params, "group_by"):
        if name not in allowed:
            raise ValidationFailed(
                f"group_by must be among {', '.join(sorted(allowed))}, got {quote(name)}.", param="group_by"
            )
        if allowed[name] not in fields:
            fields.append(allowed[name])
    page_start = start
    page = params.get("page")
    if page:
        try:
            page_start = int(str(page).removeprefix(PAGE_PREFIX)) if str(page).startswith(PAGE_PREFIX) else -1
        except ValueError:
            page_start = -1
        if page_start < start or page_start >= end or (page_start - start) % BUCKET_SECONDS[width]:
            raise ValidationFailed(f"page {quote(page)} is not a next_page of this query.", param="page")
    return ReportQuery(
        start_time=start,
        end_time=end,
        bucket_width=width,
        limit=limit,
        group_by=tuple(fields),
        models=tuple(_many(params, "models")),
        api_key_ids=tuple(_many(params, "api_key_ids")),
        page_start=page_start,
    )


def api_key_public_id(api_key_id: int | None) -> str | None:
    return None if api_key_id is None else f"key_{api_key_id}"


def _key_filter(public_ids: Iterable[str]) -> list[int]:
    return [int(p.removeprefix("key_")) for p in public_ids if p.startswith("key_") and p[4:].isdigit()]


_ROW_FIELDS = (
    *("finished_at", "model", "api_key_id", "batch_id", "tokens", "cached_tokens", "output_tokens", "rows"),
    *("completed_lines", "cost"),
)
_COST_FIELDS = (
    *("price_per_million_tokens", "price_per_million_cached_tokens", "price_per_million_output_tokens"),
    *("price_per_thousand_rows", "compute_seconds"),
)


def _rows(
    tenant_id: int, query: ReportQuery, page_end: int, endpoints: tuple[str, ...] | None
) -> Iterable[dict[str, Any]]:
    rows = UsageRecord.objects.filter(
        tenant_id=tenant_id,
        finished_at__gte=datetime.datetime.fromtimestamp(query.page_start, tz=datetime.UTC),
        finished_at__lt=datetime.datetime.fromtimestamp(page_end, tz=datetime.UTC),
    )
    if endpoints is not None:
        rows = rows.filter(endpoint__in=endpoints)
    if query.models:
        rows = rows.filter(model__in=query.models)
    if query.api_key_ids:
        rows = rows.filter(api_key_id__in=_key_filter(query.api_key_ids))
    return rows.values(*_ROW_FIELDS, *_COST_FIELDS).iterator()


def _group_key(row: dict[str, Any], fields: tuple[str, ...]) -> tuple[Any, ...]:
    values = {
        "model": row["model"],
        "api_key_id": api_key_public_id(row["api_key_id"]),
        "batch_id": row["batch_id"],
        "project_id": None,
        "user_id": None,
    }
    return tuple(values[f] for f in fields if f != "line_item")


def _line_items(row: dict[str, Any]) -> list[tuple[str, Decimal]]:
    """A row's cost by line item: input tokens (cached ones at their price), output tokens, rows and compute,
    the compute item taking the rounding remainder so the items sum exactly to the row's cost."""
    zero = Decimal(0)
    terms = PriceTerms(
        row["price_per_million_tokens"],
        zero,
        zero,
        per_million_cached_tokens=row["price_per_million_cached_tokens"],
        per_million_output_tokens=row["price_per_million_output_tokens"],
    )
    tokens = shard_cost(
        terms=terms, tokens=row["tokens"], cached_tokens=row["cached_tokens"], rows=0, compute_seconds=0
    )
    output = shard_cost(terms=terms, tokens=0, output_tokens=row["output_tokens"], rows=0, compute_seconds=0)
    rows = shard_cost(
        terms=PriceTerms(zero, row["price_per_thousand_rows"], zero), tokens=0, rows=row["rows"], compute_seconds=0
    )
    model = row["model"]
    return [
        (f"{model}, tokens", tokens),
        (f"{model}, output tokens", output),
        (f"{model}, rows", rows),
        (f"{model}, compute", row["cost"] - tokens - output - rows),
    ]


def _page(query: ReportQuery, results: dict[int, list[dict[str, Any]]], page_end: int) -> dict[str, Any]:
    width = BUCKET_SECONDS[query.bucket_width]
    data = []
    for bucket_start in range(query.page_start, page_end, width):
        data.append(
            {
                "object": "bucket",
                "start_time": bucket_start,
                "end_time": min(bucket_start + width, query.end_time),
                "start_time_iso": datetime.datetime.fromtimestamp(bucket_start, tz=datetime.UTC).isoformat(),
                "end_time_iso": datetime.datetime.fromtimestamp(
                    min(bucket_start + width, query.end_time), tz=datetime.UTC
                ).isoformat(),
                "results": results.get(bucket_start, []),
            }
        )
    has_more = page_end < query.end_time
    return {
        "object": "page",
        "data": data,
        "has_more": has_more,
        "next_page": f"{PAGE_PREFIX}{page_end}" if has_more else None,
    }


def _page_end(query: ReportQuery) -> int:
    return min(query.end_time, query.page_start + query.limit * BUCKET_SECONDS[query.bucket_width])


def usage_report(*, tenant_id: int, query: ReportQuery, kind: str) -> dict[str, Any]:
    """``GET /v1/organization/usage/{kind}``: per bucket and group, the kind's counters summed (input tokens for
    embeddings; rows for tensors; input, cached input and output tokens for completions), the requests (lines
    that completed) and the attributed compute seconds."""
    endpoints, counters = REPORT_KINDS[kind]
    width = BUCKET_SECONDS[query.bucket_width]
    page_end = _page_end(query)
    columns = [column for column in counters.values() if column is not None]
    sums: dict[tuple[int, tuple[Any, ...]], dict[str, Any]] = defaultdict(
        lambda: dict.fromkeys((*columns, "completed_lines"), 0) | {"compute_seconds": 0.0}
    )
    for row in _rows(tenant_id, query, page_end, endpoints):
        bucket = query.page_start + (int(row["finished_at"].timestamp()) - query.page_start) // width * width
        totals = sums[(bucket, _group_key(row, query.group_by))]
        for column in (*columns, "completed_lines", "compute_seconds"):
            totals[column] += row[column]
    results: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (bucket, key), totals in sorted(sums.items(), key=lambda item: str(item[0])):
        result: dict[str, Any] = {
            "object": f"organization.usage.{kind}.result",
            **{field: totals[column] if column else 0 for field, column in counters.items()},
            "num_model_requests": totals["completed_lines"],
            "compute_seconds": round(totals["compute_seconds"], 6),
            "project_id": None,
            "user_id": None,
            "api_key_id": None,
            "model": None,
            "batch_id": None,
        }
        if kind == "completions":
            # OpenAI's field says, when grouped by batch, whether the usage came from the Batch API: here it all does.
            result["batch"] = True if "batch_id" in query.group_by else None
        result.update(zip(query.group_by, key, strict=True))
        results[bucket].append(result)
    return _page(query, results, page_end)


def cost_report(*, tenant_id: int, query: ReportQuery) -> dict[str, Any]:
    """``GET /v1/organization/costs``: per bucket and group, the charged amount (exact decimal sums, shown as
    numbers like OpenAI's ``amount.value``)."""
    width = BUCKET_SECONDS[query.bucket_width]
    page_end = _page_end(query)
    by_line = "line_item" in query.group_by
    sums: dict[tuple[int, tuple[Any, ...]], Decimal] = defaultdict(Decimal)
    for row in _rows(tenant_id, query, page_end, None):
        bucket = query.page_start + (int(row["finished_at"].timestamp()) - query.page_start) // width * width
        key = _group_key(row, query.group_by)
        items: list[tuple[str | None, Decimal]] = [*_line_items(row)] if by_line else [(None, row["cost"])]
        for item, amount in items:
            if by_line and not amount:
                continue
            sums[(bucket, (*key, item) if by_line else key)] += amount
    fields = tuple(f for f in query.group_by if f != "line_item") + (("line_item",) if by_line else ())
    results: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for (bucket, key), amount in sorted(sums.items(), key=lambda item: str(item[0])):
        result: dict[str, Any] = {
            "object": "organization.costs.result",
            "amount": {"value": float(amount), "currency": DEFAULT_CURRENCY, "exact": str(amount)},
            "line_item": None,
            "project_id": None,
            "api_key_id": None,
            "model": None,
            "batch_id": None,
        }
        result.update(zip(fields, key, strict=True))
        results[bucket].append(result)
    return _page(query, results, page_end)
