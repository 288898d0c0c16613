"""Command-line values that need more than a type: choices, key=value pairs, fresh idempotency keys."""

from __future__ import annotations

import uuid
from enum import Enum

import typer


class Priority(str, Enum):
    low = "low"
    normal = "normal"
    high = "high"


class BatchStatus(str, Enum):
    validating = "validating"
    in_progress = "in_progress"
    finalizing = "finalizing"
    completed = "completed"
    failed = "failed"
    expired = "expired"
    cancelling = "cancelling"
    cancelled = "cancelled"


class BucketWidth(str, Enum):
    minute = "1m"
    hour = "1h"
    day = "1d"


class UsageReport(str, Enum):
    embeddings = "embeddings"
    tensors = "tensors"
    costs = "costs"


def metadata_parse(pairs: list[str] | None) -> dict[str, str] | None:
    """``["team=ml", "run=7"]`` → ``{"team": "ml", "run": "7"}``; the server checks OpenAI's limits."""
    if not pairs:
        return None
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--metadata")
        metadata[key.strip()] = value
    return metadata


def idempotency_headers() -> dict[str, str]:
    """A fresh Idempotency-Key per command: the SDK's own retries of a create replay the first answer
    instead of creating a second file or batch (the service honours the header, see
    docs/architecture/wire-compatibility.md, "Idempotency-Key")."""
    return {"Idempotency-Key": f"batchctl-{uuid.uuid4().hex}"}
