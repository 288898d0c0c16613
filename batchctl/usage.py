"""`batchctl usage`: the service's usage report in the shape of OpenAI's organization usage API
(`GET /v1/organization/usage/embeddings`: time buckets, each with results grouped by the fields asked)."""

from __future__ import annotations

import csv
import io
import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from rich.table import Table

from batchctl.render import timestamp

if TYPE_CHECKING:
    from openai import OpenAI

USAGE_PATH = "/organization/usage/embeddings"
# The reports `--report` picks: OpenAI's embeddings usage and costs, and this service's tensor usage.
REPORT_PATHS = {
    "embeddings": USAGE_PATH,
    "tensors": "/organization/usage/tensors",
    "costs": "/organization/costs",
}
BUCKET_WIDTHS = ("1m", "1h", "1d")
_UNITS = {"m": timedelta(minutes=1), "h": timedelta(hours=1), "d": timedelta(days=1)}
_RELATIVE = re.compile(r"^(\d+)([mhd])$")
# A server that keeps answering has_more cannot keep the CLI looping; 12 pages of 31 daily buckets is a year.
MAX_PAGES = 12


def time_parse(text: str, *, now: datetime) -> int:
    """Unix seconds from ``1732924800``, ``7d`` / ``12h`` / ``30m`` (that long before ``now``), or ISO 8601
    (``2026-11-01``, ``2026-11-01T09:00``; UTC unless it carries an offset)."""
    text = text.strip()
    if text.isdigit():
        return int(text)
    relative = _RELATIVE.match(text)
    if relative:
        return int((now - int(relative.group(1)) * _UNITS[relative.group(2)]).timestamp())
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use unix seconds, 7d / 12h / 30m ago, or ISO 8601") from None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def usage_buckets(
    client: OpenAI,
    *,
    start_time: int,
    end_time: int | None,
    bucket_width: str,
    group_by: list[str],
    limit: int | None,
    report: str = "embeddings",
) -> list[dict[str, Any]]:
    """Every bucket in the range, following ``next_page``. Raises the SDK's NotFoundError where the server
    has no usage API. Cost results get their amount as two columns, ``amount`` and ``currency``."""
    buckets: list[dict[str, Any]] = []
    page: str | None = None
    for _ in range(MAX_PAGES):
        # The SDK types name OpenAI's own group_by fields and widths; the server decides what it accepts.
        params: dict[str, Any] = {"start_time": start_time, "bucket_width": bucket_width}
        if end_time is not None:
            params["end_time"] = end_time
        if group_by:
            params["group_by"] = group_by
        if limit is not None:
            params["limit"] = limit
        if page is not None:
            params["page"] = page
        body = _fetch(client, report, params)
        buckets.extend(_flatten_amounts(body.get("data") or []))
        page = body.get("next_page")
        if not body.get("has_more") or not page:
            break
    return buckets


def _fetch(client: OpenAI, report: str, params: dict[str, Any]) -> dict[str, Any]:
    if report == "embeddings":
        return client.admin.organization.usage.embeddings(**cast(Any, params)).to_dict()
    if report == "costs":
        return client.admin.organization.usage.costs(**cast(Any, params)).to_dict()
    # Not an OpenAI report, so not in the SDK: the client's own GET (same key, same array format).
    return cast(dict[str, Any], client.get(REPORT_PATHS[report], cast_to=object, options={"params": params}))


def _flatten_amounts(buckets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for bucket in buckets:
        for result in bucket.get("results") or []:
            amount = result.pop("amount", None)
            if isinstance(amount, dict):
                result["amount"] = float(amount.get("value") or 0)
                result["currency"] = amount.get("currency")
                result.pop("exact", None)
    return buckets


def _columns(results: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(grouping fields that carry a value somewhere, numeric fields), in the order the server sent them."""
    groups: dict[str, None] = {}
    metrics: dict[str, None] = {}
    for result in results:
        for key, value in result.items():
            if key == "object":
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics[key] = None
            elif value is not None:
                groups[key] = None
    return list(groups), [m for m in metrics if m not in groups]


def usage_table(buckets: list[dict[str, Any]]) -> Table:
    """One row per (bucket, result); buckets without results (no usage) are left out."""
    results = [r for b in buckets for r in b.get("results") or []]
    groups, metrics = _columns(results)
    table = Table(box=None, header_style="bold")
    table.add_column("BUCKET START", no_wrap=True)
    for name in groups:
        table.add_column(name.upper())
    for name in metrics:
        table.add_column(name.upper(), justify="right")
    for bucket in buckets:
        for result in bucket.get("results") or []:
            table.add_row(
                timestamp(bucket.get("start_time")),
                *(str(result.get(name) if result.get(name) is not None else "–") for name in groups),
                *(f"{result.get(name, 0):,}" for name in metrics),
            )
    return table


def usage_csv(buckets: list[dict[str, Any]]) -> str:
    """The table's rows as CSV: bucket start and end (unix seconds), the grouping fields, the numbers."""
    results = [r for b in buckets for r in b.get("results") or []]
    groups, metrics = _columns(results)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["start_time", "end_time", *groups, *metrics])
    for bucket in buckets:
        for result in bucket.get("results") or []:
            writer.writerow(
                [
                    bucket.get("start_time"),
                    bucket.get("end_time"),
                    *(result.get(name) if result.get(name) is not None else "" for name in groups),
                    *(result.get(name, 0) for name in metrics),
                ]
            )
    return out.getvalue()
