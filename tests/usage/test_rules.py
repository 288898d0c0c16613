"""The attribution arithmetic, pure: shares sum exactly to the measured delta."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.usage.rules import PriceTerms, counter_delta, shard_cost, split_delta


@given(
    delta=st.integers(min_value=0, max_value=10**15),
    weights=st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=50),
)
def test_shares_sum_to_the_delta_in_proportion(delta, weights):
    shares = split_delta(delta, weights)
    assert sum(shares) == delta
    assert len(shares) == len(weights) and all(s >= 0 for s in shares)
    total = sum(weights)
    for share, weight in zip(shares, weights, strict=True):
        exact = delta * weight / total if total else delta / len(weights)
        assert abs(share - exact) < 1 + 1e-6 * exact  # whole units: at most one off the exact share


def test_split_edge_cases():
    assert split_delta(10, []) == []
    assert split_delta(10, [0, 0]) == [5, 5]
    assert split_delta(10, [1, 1, 1]) == [4, 3, 3]
    assert split_delta(0, [3, 4]) == [0, 0]
    with pytest.raises(ValueError):
        split_delta(-1, [1])


def test_counter_delta_survives_a_restart():
    assert counter_delta(previous=100, current=250) == 150
    assert counter_delta(previous=500, current=40) == 40  # reloaded: the counter started again from 0


def test_shard_cost():
    terms = PriceTerms(Decimal("0.02"), Decimal("0.5"), Decimal("0.0004"))
    assert shard_cost(terms=terms, tokens=1_000_000, rows=0, compute_seconds=0) == Decimal("0.02")
    assert shard_cost(terms=terms, tokens=0, rows=2000, compute_seconds=0.1) == Decimal("1.00004")
    assert shard_cost(terms=terms, tokens=1, rows=0, compute_seconds=0) == Decimal("0.00000002")
