"""OpenAI-style cursor pagination: newest first, ``after=<id>`` continues past that object."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db import models
from django.db.models import Q, QuerySet

from controlplane.core.errors import ValidationFailed

M = TypeVar("M", bound=models.Model)

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def parse_limit(raw: str | None, *, maximum: int = MAX_LIMIT) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError as exc:
        raise ValidationFailed(f"limit must be an integer, got {raw!r}.", param="limit") from exc
    if not 1 <= limit <= maximum:
        raise ValidationFailed(f"limit must be between 1 and {maximum}, got {limit}.", param="limit")
    return limit


def cursor_page(
    queryset: QuerySet[M],
    *,
    after: str | None,
    limit: int,
    render: Callable[[list[M]], list[dict[str, Any]]],
) -> dict[str, Any]:
    """Page over (created_at, id) descending. ``after`` must name an object of the same queryset, so
    a cursor taken from another tenant's listing finds nothing and fails as unknown."""
    qs = queryset.order_by("-created_at", "-id")
    if after:
        anchor = queryset.filter(id=after).values("created_at", "id").first()
        if anchor is None:
            raise ValidationFailed(f"after refers to an unknown object: {after!r}.", param="after")
        qs = qs.filter(Q(created_at__lt=anchor["created_at"]) | Q(created_at=anchor["created_at"], id__lt=anchor["id"]))
    rows = list(qs[: limit + 1])
    # The whole page at once, so a renderer can read what the rows share in one go.
    data = render(rows[:limit])
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(rows) > limit,
    }
