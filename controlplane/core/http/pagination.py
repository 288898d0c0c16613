"""OpenAI-style cursor pagination: newest first, ``after=<id>`` continues past that object."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from django.db import models
from django.db.models import Q, QuerySet
from rest_framework import serializers

from controlplane.core.http.errors import ValidationFailed
from controlplane.core.http.input import StrictCharField

M = TypeVar("M", bound=models.Model)

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


def cursor_limit(*, maximum: int) -> serializers.IntegerField:
    """The ``limit`` parameter of a list: objects per page, 1 to ``maximum``."""
    return serializers.IntegerField(
        required=False,
        default=DEFAULT_LIMIT,
        min_value=1,
        max_value=maximum,
        help_text=f"Objects per page, 1 to {maximum}.",
    )


class CursorQuerySerializer(serializers.Serializer[Any]):
    """The query parameters of a list (OpenAI's cursor pagination), validated by the views and published as
    their OpenAPI parameters. A list with another page-size bound overrides ``limit`` with ``cursor_limit``."""

    after = StrictCharField(
        required=False,
        allow_blank=True,
        help_text="The `last_id` of the previous page; the list continues after that object.",
    )
    limit = cursor_limit(maximum=MAX_LIMIT)


def cursor_page(
    queryset: QuerySet[M],
    *,
    after: str | None = None,
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
