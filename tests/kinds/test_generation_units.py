"""The scheduler's token figures for a generation line (DESIGN.md, "Generation batches")."""

from __future__ import annotations

import pytest

from controlplane.kinds.generation.render import EngineChoice, EngineResult
from controlplane.kinds.generation.units import (
    estimated_charge,
    fair_share_charge,
    line_prompt_tokens,
    line_reservation,
    result_charge,
)
from tests.kinds.test_generation_bodies import chat, completion


def test_quota_counts_the_prompt_once_whatever_n(tokenizer):
    one, three = chat(tokenizer, n=1), chat(tokenizer, n=3)
    assert line_prompt_tokens(one) == line_prompt_tokens(three) == len(one.prompt_token_ids)


def test_reservation_is_n_sequences_of_prompt_plus_max_tokens(tokenizer):
    request = completion(tokenizer, n=3, max_tokens=10)
    assert line_reservation(request) == 3 * (request.prompt_tokens + 10)
    # Without max_tokens, chat reserves the whole context per sequence.
    assert line_reservation(chat(tokenizer, n=2)) == 2 * 128


def test_fair_share_charge_discounts_cached_prompt_and_weights_completion():
    assert fair_share_charge(prompt_tokens=100, cached_tokens=40, completion_tokens=10, completion_weight=3.0) == 90.0
    assert fair_share_charge(prompt_tokens=100, cached_tokens=0, completion_tokens=0, completion_weight=3.0) == 100.0


@pytest.mark.parametrize(
    "counts",
    [
        {"prompt_tokens": 5, "cached_tokens": 6, "completion_tokens": 0, "completion_weight": 1.0},
        {"prompt_tokens": 5, "cached_tokens": -1, "completion_tokens": 0, "completion_weight": 1.0},
        {"prompt_tokens": 5, "cached_tokens": 0, "completion_tokens": -1, "completion_weight": 1.0},
        {"prompt_tokens": 5, "cached_tokens": 0, "completion_tokens": 1, "completion_weight": -1.0},
    ],
)
def test_impossible_counts_are_refused(counts):
    with pytest.raises(ValueError):
        fair_share_charge(**counts)


def test_estimate_uses_max_tokens_then_a_measured_mean(tokenizer):
    request = completion(tokenizer, n=2, max_tokens=10)
    p = request.prompt_tokens
    assert estimated_charge(request, completion_weight=2.0) == p + 2.0 * 2 * 10
    assert estimated_charge(request, completion_weight=2.0, expected_completion_tokens=3.4) == p + 2.0 * 2 * 3
    # A measured mean above the line's own limit cannot be reached by this line.
    assert estimated_charge(request, completion_weight=2.0, expected_completion_tokens=50) == p + 2.0 * 2 * 10


def test_result_charge_follows_what_the_engine_reports():
    choices = (
        EngineChoice(text="a", finish_reason="stop", completion_tokens=4),
        EngineChoice(text="b", finish_reason="length", completion_tokens=6),
    )
    result = EngineResult(choices=choices, prompt_tokens=30, cached_tokens=20)
    assert result.completion_tokens == 10
    assert result_charge(result, completion_weight=1.5) == (30 - 20) + 1.5 * 10
