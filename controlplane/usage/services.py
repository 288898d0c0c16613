"""Writes to the usage ledger. ``usage_record_shard`` runs inside ``shard_commit``'s transaction, so a
shard's ledger row exists exactly when its part is published."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction

from controlplane.usage.models import BatchOrigin, ComputeSource, UsageRecord
from controlplane.usage.rules import PriceTerms, shard_cost
from controlplane.usage.selectors import price_in_force
from controlplane.usage.spendcap import spend_cap_mark


def record_terms(record: UsageRecord) -> PriceTerms:
    return PriceTerms(
        per_million_tokens=record.price_per_million_tokens,
        per_thousand_rows=record.price_per_thousand_rows,
        per_gpu_second=record.price_per_gpu_second,
        per_million_cached_tokens=record.price_per_million_cached_tokens,
        per_million_output_tokens=record.price_per_million_output_tokens,
    )


def record_cost(record: UsageRecord) -> Decimal:
    """A ledger row's cost at the prices it carries."""
    return shard_cost(
        terms=record_terms(record),
        tokens=record.tokens,
        rows=record.rows,
        compute_seconds=record.compute_seconds,
        cached_tokens=record.cached_tokens,
        output_tokens=record.output_tokens,
    )


def batch_origin_record(*, batch_id: str, api_key_id: int | None) -> None:
    """Remember the API key that created a batch, so its ledger rows can be grouped by key."""
    if api_key_id is not None:
        BatchOrigin.objects.get_or_create(batch_id=batch_id, defaults={"api_key_id": api_key_id})


@dataclass(frozen=True)
class ShardUsage:
    """What a committed shard did, as the batches app knows it (the ledger imports nothing from batches).
    ``tokens`` (input, ``cached_tokens`` of them from the prefix cache), ``output_tokens`` and ``rows`` are what
    its finished lines are billed, as its endpoint kind counts them (kinds/base.EndpointKind.ledger_units)."""

    shard_id: int
    batch_id: str
    tenant_id: int
    endpoint: str
    model_name: str
    model_snapshot: dict[str, Any] | None
    server: str
    completed: int
    failed: int
    tokens: int
    rows: int
    started_at: datetime | None
    finished_at: datetime
    # Ran for a batch that then failed validation or was cancelled: charged, its output thrown away.
    discarded: bool = False
    output_tokens: int = 0
    cached_tokens: int = 0
    # The part of the shard this entry bills (one of several when its lines named LoRA adapters, each billed under
    # its own `base:adapter` name): its dispatch seconds are this share of the shard's.
    share: float = 1.0


def usage_record_shard(*, usage: ShardUsage) -> UsageRecord:
    """One ledger row for a shard that just committed, charged at the price in force at its commit.

    Tokens and rows come priced as the endpoint kind counts them (embeddings: measured tokens; tensors: rows
    of the lines that completed). Compute seconds start as the shard's dispatch time (claim to commit) and
    are replaced by its share of Triton's measured busy time once the attribution beat covers its placement
    (usage/attribution.py)."""
    u = usage
    snapshot = u.model_snapshot or {}
    dispatch_seconds = max(0.0, (u.finished_at - u.started_at).total_seconds()) * u.share if u.started_at else 0.0
    # Prices are per catalogue model: a LoRA adapter's lines (`base:adapter`) are charged at its base's.
    base_name = u.model_name.partition(":")[0]
    price = price_in_force(model_name=base_name, at=u.finished_at)
    origin = BatchOrigin.objects.filter(batch_id=u.batch_id).values_list("api_key_id", flat=True).first()
    record = UsageRecord(
        tenant_id=u.tenant_id,
        api_key_id=origin,
        batch_id=u.batch_id,
        shard_id=u.shard_id,
        endpoint=u.endpoint,
        model=u.model_name,
        triton_model=str(snapshot.get("triton_name") or base_name),
        server=u.server,
        completed_lines=u.completed,
        failed_lines=u.failed,
        tokens=u.tokens,
        cached_tokens=u.cached_tokens,
        output_tokens=u.output_tokens,
        rows=u.rows,
        started_at=u.started_at,
        finished_at=u.finished_at,
        dispatch_seconds=dispatch_seconds,
        compute_seconds=dispatch_seconds,
        compute_source=ComputeSource.DISPATCH,
        discarded=u.discarded,
    )
    if price is not None:
        record.price = price
        record.price_per_million_tokens = price.per_million_tokens
        record.price_per_million_cached_tokens = price.per_million_cached_tokens
        record.price_per_million_output_tokens = price.per_million_output_tokens
        record.price_per_thousand_rows = price.per_thousand_rows
        record.price_per_gpu_second = price.per_gpu_second
        record.currency = price.currency
    record.cost = record_cost(record)
    record.save()
    if record.cost:
        spend_cap_mark(tenant_id=u.tenant_id, now=u.finished_at)
    return record


def usage_records_attribute(*, shares: dict[int, float]) -> None:
    """Replace the compute seconds of ledger rows (id → seconds) with their measured share and re-price
    them at the price each row already carries."""
    with transaction.atomic():
        for record in UsageRecord.objects.select_for_update().filter(id__in=list(shares)):
            record.compute_seconds = shares[record.id]
            record.compute_source = ComputeSource.STATISTICS
            record.cost = record_cost(record)
            record.save(update_fields=["compute_seconds", "compute_source", "cost"])
