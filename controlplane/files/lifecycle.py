"""OpenAI's file expiry policy: ``expires_after`` on an upload, ``output_expires_after`` on a batch.

Both are ``{"anchor": "created_at", "seconds": N}``: the file expires N seconds after its own creation.
Expired files disappear from the tenant's view at once (files/selectors.py) and are deleted by beat
(files/retention.files_expire), except an input file that a live batch still reads."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from controlplane.core.http.errors import ValidationFailed, quote
from controlplane.files.models import File

# OpenAI's bounds on expires_after.seconds: one hour to 30 days.
EXPIRES_AFTER_MIN_SECONDS = 3600
EXPIRES_AFTER_MAX_SECONDS = 30 * 24 * 3600
_ANCHORS = ("created_at",)


def expires_after_parse(value: Any, *, param: str) -> int | None:
    """The seconds of an ``{"anchor": "created_at", "seconds": N}`` object, or None when it is absent.
    Anything else is a 400 naming the field (``param``, ``param.anchor`` or ``param.seconds``)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValidationFailed(
            f'{param} must be an object {{"anchor": "created_at", "seconds": N}}, got {quote(value)}.', param=param
        )
    unknown = sorted(str(key) for key in value if key not in ("anchor", "seconds"))
    if unknown:
        raise ValidationFailed(f"{param} has unknown fields: {quote(unknown)}.", param=param)
    anchor = value.get("anchor")
    if anchor not in _ANCHORS:
        raise ValidationFailed(f"{param}.anchor must be 'created_at', got {quote(anchor)}.", param=f"{param}.anchor")
    seconds = value.get("seconds")
    # bool is an int to Python, never to a client that meant a number.
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        raise ValidationFailed(
            f"{param}.seconds must be an integer number of seconds, got {quote(seconds)}.", param=f"{param}.seconds"
        )
    if not EXPIRES_AFTER_MIN_SECONDS <= seconds <= EXPIRES_AFTER_MAX_SECONDS:
        raise ValidationFailed(
            f"{param}.seconds must be between {EXPIRES_AFTER_MIN_SECONDS} (1 hour) and "
            f"{EXPIRES_AFTER_MAX_SECONDS} (30 days), got {seconds}.",
            param=f"{param}.seconds",
        )
    return seconds


def expires_after_from_form(data: Mapping[str, Any], *, param: str = "expires_after") -> int | None:
    """``expires_after`` from a multipart form, as the openai SDK sends it: the fields
    ``expires_after[anchor]`` and ``expires_after[seconds]``, every value a string."""
    prefix = f"{param}["
    fields = {str(key)[len(prefix) : -1]: data.get(key) for key in data if str(key).startswith(prefix)}
    if param in data:
        raise ValidationFailed(
            f"Send {param} as the form fields {param}[anchor] and {param}[seconds].", param=param, code="invalid_value"
        )
    if not fields:
        return None
    seconds = fields.get("seconds")
    if isinstance(seconds, str) and seconds.isascii() and seconds.isdigit():
        fields["seconds"] = int(seconds)
    return expires_after_parse(fields, param=param)


def file_expiry_set(*, file: File, seconds: int | None) -> None:
    """Set a saved file's ``expires_at`` to its ``created_at`` plus ``seconds`` (OpenAI's anchor is the
    file's own creation); None leaves it unset. Call in the transaction that created the row."""
    if seconds is None:
        return
    file.expires_at = file.created_at + timedelta(seconds=seconds)
    file.save(update_fields=["expires_at"])
