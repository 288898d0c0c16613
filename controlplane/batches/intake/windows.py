from __future__ import annotations

import re
from datetime import timedelta

from django.conf import settings

from controlplane.core.http.errors import ValidationFailed

_WINDOW = re.compile(r"^(\d+)([smh])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


def parse_completion_window(value: object) -> timedelta:
    """Accept the configured windows only ("24h" by default, as OpenAI; tests add shorter ones)."""
    allowed = settings.BATCH_COMPLETION_WINDOWS
    match = _WINDOW.match(value) if isinstance(value, str) else None
    if match is None or value not in allowed:
        raise ValidationFailed(f"completion_window must be one of {allowed}, got {value!r}.", param="completion_window")
    return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
