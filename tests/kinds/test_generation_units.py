"""The scheduler's token figures for a generation line (DESIGN.md, "Generation batches")."""

from __future__ import annotations

import orjson
import pytest

from controlplane.kinds.base import OUTPUT_LINE_BYTES
from controlplane.kinds.generation.render import (
    EngineChoice,
    EngineResult,
    TokenLogprob,
    TopLogprob,
    render_completion,
)
from controlplane.kinds.generation.units import (
    BODY_BYTES,
    CHOICE_BYTES,
    estimated_charge,
    fair_share_charge,
    line_output_bytes,
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


# An output line's own fields around the body ({"id": "batch_req_…", "custom_id": …, "response": {"status_code":
# 200, "request_id": …, "body": …}, "error": null}).
LINE_ENVELOPE_BYTES = 150


def _rendered_bytes(request) -> int:
    """The body a line of ``request`` writes when every choice runs to max_tokens (words of four characters)."""
    top = request.top_logprobs if request.logprobs else 0
    entry = TokenLogprob(" word", -1.2345678, tuple(TopLogprob(f" alt{i}", -2.3456789) for i in range(top)))
    choice = EngineChoice(
        text=" word" * request.max_tokens,
        finish_reason="length",
        completion_tokens=request.max_tokens,
        logprobs=(entry,) * request.max_tokens if request.logprobs else None,
    )
    result = EngineResult(choices=(choice,) * request.n, prompt_tokens=request.prompt_tokens)
    return len(orjson.dumps(render_completion(request, result, request_id="r", created=0)))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"n": 4},
        {"logprobs": True},
        {"logprobs": True, "top_logprobs": 20},
        {"n": 3, "logprobs": True, "top_logprobs": 5},
    ],
)
def test_output_estimate_covers_what_render_writes_and_not_far_more(tokenizer, fields):
    # The storage reservation's per-line figure against the body render.py writes for the same line: never
    # under it (with the envelope's allowance), within a small factor of it, logprobs counted.
    request = chat(tokenizer, max_tokens=16, **fields)
    estimate = line_output_bytes(request, expected_completion_tokens=None) + OUTPUT_LINE_BYTES
    written = _rendered_bytes(request) + LINE_ENVELOPE_BYTES
    assert written <= estimate < 3 * written, (written, estimate)


def test_output_estimate_follows_the_measured_mean_completion(tokenizer):
    request = chat(tokenizer, max_tokens=100, logprobs=True, top_logprobs=2)
    full = line_output_bytes(request, expected_completion_tokens=None)
    per_token = (full - BODY_BYTES - CHOICE_BYTES) / 100
    assert line_output_bytes(request, expected_completion_tokens=10.4) == BODY_BYTES + CHOICE_BYTES + 10 * per_token
    assert line_output_bytes(request, expected_completion_tokens=500) == full  # capped at max_tokens
