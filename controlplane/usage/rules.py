"""The ledger's arithmetic, pure (no Django, no clock): what a shard costs, and how one interval's
measured busy time is split across the shards that ran on a placement (docs/operations/usage.md)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

# Decimal places of a stored amount (the ledger's columns, models.py): a few tokens at a cheap model's price are
# fractions of a micro-dollar, and rounding each shard's cost to cents would lose real money over millions of shards.
AMOUNT_PLACES = 9
_AMOUNT_QUANTUM = Decimal(1).scaleb(-AMOUNT_PLACES)


@dataclass(frozen=True)
class PriceTerms:
    per_million_tokens: Decimal
    per_thousand_rows: Decimal
    per_gpu_second: Decimal
    # None: charged at per_million_tokens (a price list that predates them, or one that does not split).
    per_million_cached_tokens: Decimal | None = None
    per_million_output_tokens: Decimal | None = None


def token_cost(*, terms: PriceTerms, tokens: int, cached_tokens: int = 0, output_tokens: int = 0) -> Decimal:
    """Unrounded: uncached input at the input price, cached input and output at theirs (per 1M tokens)."""
    if not 0 <= cached_tokens <= tokens or output_tokens < 0:
        raise ValueError("token counts must be non-negative, cached within the input")
    cached_price = (
        terms.per_million_tokens if terms.per_million_cached_tokens is None else terms.per_million_cached_tokens
    )
    output_price = (
        terms.per_million_tokens if terms.per_million_output_tokens is None else terms.per_million_output_tokens
    )
    return (
        Decimal(tokens - cached_tokens) * terms.per_million_tokens
        + Decimal(cached_tokens) * cached_price
        + Decimal(output_tokens) * output_price
    ) / Decimal(1_000_000)


def shard_cost(
    *, terms: PriceTerms, tokens: int, rows: int, compute_seconds: float, cached_tokens: int = 0, output_tokens: int = 0
) -> Decimal:
    """Tokens at their prices (token_cost) + rows × price per 1k rows / 10³ + compute seconds × price per
    GPU-second, rounded half up to the ledger's 9 decimal places."""
    amount = (
        token_cost(terms=terms, tokens=tokens, cached_tokens=cached_tokens, output_tokens=output_tokens)
        + Decimal(rows) * terms.per_thousand_rows / Decimal(1_000)
        # repr of a float is its shortest exact decimal: no binary noise reaches the amount.
        + Decimal(repr(float(compute_seconds))) * terms.per_gpu_second
    )
    return amount.quantize(_AMOUNT_QUANTUM, rounding=ROUND_HALF_UP)


def counter_delta(*, previous: int, current: int) -> int:
    """Growth of a cumulative counter between two reads. A smaller reading means the counter restarted
    (the model was reloaded or Triton restarted): everything it counted since then is new."""
    return current - previous if current >= previous else current


def split_delta(delta: int, weights: list[int]) -> list[int]:
    """Split ``delta`` (nanoseconds, ≥ 0) in proportion to ``weights`` (rows or tokens, ≥ 0), in whole
    units that sum exactly to ``delta`` (largest remainder; ties to the earlier entry). All-zero weights
    share equally. No weights: nothing to split, an empty list."""
    if not weights:
        return []
    if delta < 0 or any(w < 0 for w in weights):
        raise ValueError("delta and weights must be non-negative")
    total = sum(weights)
    if total == 0:
        weights, total = [1] * len(weights), len(weights)
    shares = [delta * w // total for w in weights]
    remainders = [(delta * w % total, -i) for i, w in enumerate(weights)]
    left = delta - sum(shares)
    for _, negative_index in sorted(remainders, reverse=True)[:left]:
        shares[-negative_index] += 1
    return shares
