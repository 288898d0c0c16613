"""Command-line options shared by the key commands (tenant_create, api_key_create)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_expiry_arguments(parser: CommandParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--expires-in", metavar="DURATION", help="e.g. 90d, 12h, 30m: the key expires then")
    group.add_argument(
        "--expires-at", metavar="DATETIME", help="ISO 8601, e.g. 2027-06-30T00:00:00Z (UTC when no offset)"
    )


def expiry_from_options(options: dict[str, object]) -> datetime | None:
    """The expiry the options ask for, or None (the key never expires)."""
    expires_in, expires_at = options.get("expires_in"), options.get("expires_at")
    if isinstance(expires_in, str):
        match = _DURATION.match(expires_in)
        if match is None:
            raise CommandError(f"--expires-in must be a number and a unit (s, m, h, d), e.g. 90d; got {expires_in!r}")
        return timezone.now() + timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
    if isinstance(expires_at, str):
        try:
            parsed = datetime.fromisoformat(expires_at)
        except ValueError as exc:
            raise CommandError(f"--expires-at must be an ISO 8601 date and time; got {expires_at!r}") from exc
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return None
