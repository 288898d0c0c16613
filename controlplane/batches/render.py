from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.batches.models import Batch, BatchStatus, StopReason
from controlplane.core.observability.tracing import trace_id_of
from controlplane.usage.selectors import Amount, batch_cost


def _ts(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value else None


def public_status(batch: Batch) -> str:
    """The status a tenant sees. A cancelled batch writes its files under ``finalizing`` like any other, but
    OpenAI's documented path is in_progress → cancelling → cancelled, so it stays ``cancelling`` until then."""
    if batch.status == BatchStatus.FINALIZING and batch.stop_reason == StopReason.CANCEL:
        return BatchStatus.CANCELLING
    return batch.status


def batch_render(batch: Batch, *, queue: dict[str, Any] | None = None, cost: Amount | None = None) -> dict[str, Any]:
    """OpenAI's Batch object, field for field, plus extra fields the SDK passes through: ``priority``,
    ``queue`` (position among the model's runnable batches and an estimated start; null when none of the
    batch's shards is waiting), ``rerun_of`` (the batch whose failed lines this one re-runs) and ``cost``
    (charged so far, from the usage ledger; looked up when not given) and ``trace_id`` (the batch's trace in
    the trace UI; null when tracing was off at create)."""
    cost = cost if cost is not None else batch_cost(batch_id=batch.id)
    # Shards may already run while the file is validated (batches/intake/early_dispatch.py): none of it shows
    # before the file proves valid.
    validating = batch.status == BatchStatus.VALIDATING
    completed, failed, tokens, output, cached = (
        (0, 0, 0, 0, 0)
        if validating
        else (
            batch.completed_lines,
            batch.failed_lines,
            batch.prompt_tokens,
            batch.completion_tokens,
            batch.cached_tokens,
        )
    )
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": (batch.model or None) if not validating else None,
        "errors": batch.errors,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": public_status(batch),
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {
            "total": batch.total_lines,
            "completed": completed,
            "failed": failed,
        },
        # OpenAI's usage of the completed lines: input (prompt or embeddings input) and generated tokens.
        "usage": {
            "input_tokens": tokens,
            "output_tokens": output,
            "total_tokens": tokens + output,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
        "metadata": batch.metadata,
        "priority": batch.priority,
        "queue": queue,
        "rerun_of": batch.rerun_of,
        "cost": {"value": float(cost.value), "currency": cost.currency},
        "trace_id": trace_id_of(batch.trace_parent),
    }
