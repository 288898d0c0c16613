"""A committed shard's ledger entry, built from its row: by its commit (shards.shard_commit), or, for the
shards that committed while their batch still validated, when the file proved valid
(batches/intake/early_dispatch.py)."""

from __future__ import annotations

from controlplane.batches.models import Shard, ShardStatus
from controlplane.kinds.base import TokenCounts
from controlplane.kinds.registry import kind_for
from controlplane.usage.services import ShardUsage, usage_record_shard


def shard_usage_from_row(shard: Shard, *, discarded: bool = False) -> ShardUsage:
    """A committed shard's ledger entry (its batch loaded alongside), billed as its endpoint kind counts."""
    assert shard.finished_at is not None  # set by the commit
    billed = kind_for(shard.batch.endpoint).ledger_units(
        completed=shard.completed_lines,
        runnable=shard.request_count - shard.body_errors,
        estimated_work_units=shard.work_units,
        measured=TokenCounts(
            shard.prompt_tokens, shard.completion_tokens, shard.cached_tokens, shard.completion_choices
        ),
    )
    return ShardUsage(
        shard_id=shard.id,
        batch_id=shard.batch_id,
        tenant_id=shard.batch.tenant_id,
        endpoint=shard.batch.endpoint,
        model_name=shard.batch.model,
        model_snapshot=shard.batch.model_snapshot,
        server=shard.triton_server,
        completed=shard.completed_lines,
        failed=shard.failed_lines,
        tokens=billed.tokens,
        rows=billed.rows,
        output_tokens=billed.output_tokens,
        cached_tokens=billed.cached_tokens,
        started_at=shard.started_at,
        finished_at=shard.finished_at,
        discarded=discarded,
    )


def held_usage_record(*, batch_id: str, discarded: bool = False) -> int:
    """Inside the transaction that makes the batch in_progress: the ledger rows of the shards that
    committed while it validated (a commit after that transaction writes its own). ``discarded``: inside the
    one that fails or cancels it instead (batches/intake/early_dispatch.shards_discard)."""
    held = Shard.objects.filter(batch_id=batch_id, status__in=(ShardStatus.SUCCEEDED, ShardStatus.STOPPED))
    count = 0
    for shard in held.select_related("batch"):
        usage_record_shard(usage=shard_usage_from_row(shard, discarded=discarded))
        count += 1
    return count
