"""The generation engine's search and config rewrite (build_engines/tune_generation.py), without a server.

The cost model: tokens/s peaks at 32 sequences (fewer leave the cores idle between steps, more spend them on
a KV cache too large to stay in the CPU's caches), and p95 grows with the sequences; a larger KV budget alone
changes nothing."""

from __future__ import annotations

import math

import pytest

from build_engines.tune_config import parse
from build_engines.tune_generation import (
    GENERATION_AXES,
    GenerationLimits,
    GenerationShape,
    generation_shape_of,
    rewrite_generation,
    valid_generation,
)
from build_engines.tune_search import Measurement, search

BASELINE = GenerationShape(max_num_seqs=8, kv_budget_tokens=2048)  # 256 tokens a sequence
LIMITS = GenerationLimits(cores=2, max_num_seqs=128, kv_per_seq=256, max_kv_budget_tokens=65536)
TRIAL_S = 10.0


def peaked(shape: GenerationShape) -> Measurement:
    tokens_per_s = 500 / (1 + 0.15 * (math.log2(shape.max_num_seqs) - 5) ** 2)
    return Measurement(rows_per_s=tokens_per_s, p95_ms=200.0 + 10.0 * shape.max_num_seqs)


def run(cost, *, limits=LIMITS, budget_s=600.0, baseline=BASELINE):
    now, measured = [0.0], []

    def measure(shape: GenerationShape) -> Measurement:
        now[0] += TRIAL_S
        measured.append(shape)
        return cost(shape)

    result = search(
        baseline,
        measure,
        limits,
        budget_s=budget_s,
        clock=lambda: now[0],
        axes=GENERATION_AXES,
        is_valid=valid_generation,
    )
    return result, measured


def test_the_search_finds_the_best_max_num_seqs_keeping_each_sequence_its_kv():
    result, measured = run(peaked)
    assert result.chosen.shape == GenerationShape(32, 32 * 256)
    assert result.chosen.measurement.rows_per_s == pytest.approx(500.0)
    assert measured[0] == measured[1] == BASELINE
    # Every candidate had room for its sequences at the baseline's KV tokens a sequence.
    assert all(s.kv_budget_tokens >= 256 * s.max_num_seqs for s in measured)
    assert all(valid_generation(s, LIMITS) for s in measured)
    # The budget alone was tried at the best sequences, and lost (it changes nothing here).
    assert GenerationShape(32, 2 * 32 * 256) in measured


def test_a_latency_bound_keeps_the_search_below_it():
    result, _ = run(peaked, limits=GenerationLimits(2, 128, 256, 65536, max_p95_ms=400.0))
    assert result.chosen.shape == GenerationShape(16, 16 * 256)  # 32 sequences' p95 is 520 ms


def test_a_worse_shape_never_replaces_the_current_config():
    result, _ = run(peaked, baseline=GenerationShape(32, 32 * 256))
    assert result.chosen.shape == GenerationShape(32, 32 * 256)
    assert result.gain == 0.0


def test_the_limits_bound_the_sequences_and_the_budget():
    limits = GenerationLimits(cores=2, max_num_seqs=16, kv_per_seq=256, max_kv_budget_tokens=4096)
    _, measured = run(lambda s: Measurement(rows_per_s=100.0 * s.max_num_seqs, p95_ms=1.0), limits=limits)
    assert max(s.max_num_seqs for s in measured) == 16
    assert max(s.kv_budget_tokens for s in measured) <= 4096


CONFIG = """\
name: "gen"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
parameters [
  {
    # KV cache in tokens: room for every sequence at the context limit.
    key: "KV_BUDGET_TOKENS"
    value: { string_value: "16384" }
  },
  {
    # Sequences decoding at once.
    key: "MAX_NUM_SEQS"
    value: { string_value: "64" }
  },
  { key: "BLOCK_SIZE", value: { string_value: "16" } }
]
"""


def test_the_rewrite_sets_only_the_two_parameters_and_keeps_the_comments():
    written = rewrite_generation(CONFIG, GenerationShape(128, 32768))
    assert generation_shape_of(parse(written)) == GenerationShape(128, 32768)
    assert parse(written).parameters["BLOCK_SIZE"].string_value == "16"
    assert written == CONFIG.replace('"16384"', '"32768"').replace('"64"', '"128"')


def test_a_config_without_the_parameters_is_refused():
    from build_engines.errors import SpecError

    with pytest.raises(SpecError, match="MAX_NUM_SEQS"):
        generation_shape_of(parse(CONFIG.replace("MAX_NUM_SEQS", "OTHER")))
