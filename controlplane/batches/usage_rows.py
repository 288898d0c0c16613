"""A committed shard's ledger entry, built from its row: by its commit (shards.shard_commit), or, for the
shards that committed while their batch still validated, when the file proved valid
(batches/intake/early_dispatch.py)."""

from __future__ import annotations

from controlplane.batches.models import Shard, ShardStatus
from controlplane.kinds.base import TokenCounts
from controlplane.kinds.registry import kind_for
from controlplane.usage.services import ShardUsage, usage_record_shard


def shard_usage_from_row(shard: Shard, *, discarded: bool = False) -> list[ShardUsage]:
    """A committed shard's ledger entries (its batch loaded alongside), billed as its endpoint kind counts: one for
    the batch's model and one per LoRA adapter its lines named (``Shard.adapter_usage``), so a tenant's report
    shows tokens per adapter (``tinylm:double``). The model's entry keeps the failed lines; one with nothing to
    bill is left out when adapters carry the shard. Dispatch seconds are shared by tokens (``share``)."""
    assert shard.finished_at is not None  # set by the commit
    totals = [
        shard.completed_lines,
        shard.prompt_tokens,
        shard.completion_tokens,
        shard.cached_tokens,
        shard.completion_choices,
    ]
    parts: list[tuple[str, list[int]]] = []
    for name, counts in sorted((shard.adapter_usage or {}).items()):
        parts.append((name, [int(v) for v in counts]))
        totals = [total - int(v) for total, v in zip(totals, counts, strict=True)]
    entries = [(shard.batch.model, totals)] if not parts or totals[0] or shard.failed_lines else []
    weight_all = max(1, shard.prompt_tokens + shard.completion_tokens)
    usages = []
    for name, (completed, prompt, completion, cached, choices) in [*entries, *parts]:
        billed = kind_for(shard.batch.endpoint).ledger_units(
            completed=completed,
            runnable=shard.request_count - shard.body_errors,
            estimated_work_units=shard.work_units,
            measured=TokenCounts(prompt, completion, cached, choices),
        )
        usages.append(
            ShardUsage(
                shard_id=shard.id,
                batch_id=shard.batch_id,
                tenant_id=shard.batch.tenant_id,
                endpoint=shard.batch.endpoint,
                model_name=name,
                model_snapshot=shard.batch.model_snapshot,
                server=shard.triton_server,
                completed=completed,
                failed=shard.failed_lines if name == shard.batch.model else 0,
                tokens=billed.tokens,
                rows=billed.rows,
                output_tokens=billed.output_tokens,
                cached_tokens=billed.cached_tokens,
                started_at=shard.started_at,
                finished_at=shard.finished_at,
                discarded=discarded,
                share=(prompt + completion) / weight_all if parts else 1.0,
            )
        )
    return usages


def held_usage_record(*, batch_id: str, discarded: bool = False) -> int:
    """Inside the transaction that makes the batch in_progress: the ledger rows of the shards that
    committed while it validated (a commit after that transaction writes its own). ``discarded``: inside the
    one that fails or cancels it instead (batches/intake/early_dispatch.shards_discard)."""
    held = Shard.objects.filter(batch_id=batch_id, status__in=(ShardStatus.SUCCEEDED, ShardStatus.STOPPED))
    count = 0
    for shard in held.select_related("batch"):
        for usage in shard_usage_from_row(shard, discarded=discarded):
            usage_record_shard(usage=usage)
        count += 1
    return count
