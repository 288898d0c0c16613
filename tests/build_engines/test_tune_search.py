"""The tuner's search over synthetic cost models whose best shape is known (build_engines/tune_search.py).

No server: `measure` is a function of the shape and a fake clock advances a fixed time per measurement,
so the budget is exact and each test runs in milliseconds."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

from build_engines.tune_search import DELAYS_US, Limits, Measurement, SearchError, Shape, search, valid

BASELINE = Shape(max_batch_size=8, delay_us=2000, preferred=(), instances=1, threads=1)
LIMITS = Limits(cores=4, max_batch_size=128, max_instances=4)
TRIAL_S = 10.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(cost: Callable[[Shape], Measurement], *, limits: Limits = LIMITS, budget_s: float = 600.0, baseline=BASELINE):
    clock, measured = FakeClock(), []

    def measure(shape: Shape) -> Measurement:
        clock.now += TRIAL_S
        measured.append(shape)
        return cost(shape)

    return search(baseline, measure, limits, budget_s=budget_s, clock=clock), measured


def peaked(shape: Shape) -> Measurement:
    """Best at batch 32, 2 instances x 2 threads, 1 ms delay, no preferred sizes; p95 grows with the batch."""
    batch = 1 / (1 + 0.1 * (math.log2(shape.max_batch_size) - 5) ** 2)
    layout = 1 / (1 + 0.2 * ((math.log2(shape.instances) - 1) ** 2 + (math.log2(shape.threads or 1) - 1) ** 2))
    delay = 1 / (1 + 0.05 * abs(DELAYS_US.index(shape.delay_us or 0) - DELAYS_US.index(1000)))
    preferred = 1.0 if not shape.preferred else 0.95
    return Measurement(rows_per_s=1000 * batch * layout * delay * preferred, p95_ms=100.0 + 2.0 * shape.max_batch_size)


def test_the_search_finds_the_known_best_within_its_budget():
    result, measured = run(peaked, budget_s=400.0)
    assert result.chosen.shape == Shape(32, 1000, (), 2, 2)
    assert len(measured) <= 400.0 / TRIAL_S
    assert result.chosen.measurement.rows_per_s == pytest.approx(1000.0)
    assert result.gain > 0.5
    # The baseline was measured first, twice, and is what the gain is against.
    assert measured[0] == measured[1] == BASELINE
    assert [t.note for t in result.trials[:2]] == ["baseline", "baseline, repeated"]


def test_a_budget_stops_the_search_and_keeps_the_best_found_so_far():
    result, measured = run(peaked, budget_s=55.0)
    # Two baseline runs, batch 4 and 16, 16 again to confirm it; then one more would not fit the 55 s.
    assert measured == [
        BASELINE,
        BASELINE,
        Shape(4, 2000, (), 1, 1),
        Shape(16, 2000, (), 1, 1),
        Shape(16, 2000, (), 1, 1),
    ]
    assert result.stopped_by_budget
    assert "untried" in result.notes[0]
    assert result.chosen.shape == Shape(16, 2000, (), 1, 1)


def test_a_winner_without_time_to_confirm_it_does_not_replace_the_baseline():
    result, measured = run(peaked, budget_s=45.0)
    assert len(measured) == 4 and measured[3].max_batch_size == 16  # it won its one run
    assert result.chosen.shape == BASELINE


def test_a_lucky_run_is_not_confirmed():
    runs: dict[Shape, int] = {}

    def lucky_once(shape: Shape) -> Measurement:
        runs[shape] = runs.get(shape, 0) + 1
        lucky = shape.max_batch_size == 16 and runs[shape] == 1  # 16 rows is fast only the first time
        return Measurement(rows_per_s=200.0 if lucky else 100.0 - (shape != BASELINE), p95_ms=10.0)

    result, measured = run(lucky_once)
    assert measured.count(Shape(16, 2000, (), 1, 1)) == 2
    assert result.chosen.shape == BASELINE


def test_nothing_within_the_noise_replaces_the_baseline():
    def flat(shape: Shape) -> Measurement:
        # Every other shape 2 % faster: below the 3 % that counts.
        return Measurement(rows_per_s=100.0 if shape == BASELINE else 102.0, p95_ms=50.0)

    result, measured = run(flat)
    assert result.chosen.shape == BASELINE
    assert result.gain == 0.0
    assert len(measured) > 3  # it did look


def test_a_noisy_baseline_raises_the_bar_to_its_own_spread():
    runs = iter([100.0, 90.0])  # the baseline's two runs differ by 10 %

    def noisy(shape: Shape) -> Measurement:
        rows = next(runs) if shape == BASELINE else (104.0 if shape.max_batch_size == 16 else 50.0)
        return Measurement(rows_per_s=rows, p95_ms=10.0)

    result, _ = run(noisy)
    assert result.noise == pytest.approx(0.1)
    assert result.chosen.shape == BASELINE  # 104 is within 10 % of the baseline's mean, 95


def test_the_latency_bound_is_respected():
    result, _ = run(peaked, limits=Limits(cores=4, max_batch_size=128, max_instances=4, max_p95_ms=150.0))
    assert result.chosen.shape.max_batch_size == 16  # 32 is faster but its p95 (164 ms) is over the bound
    assert result.chosen.measurement.p95_ms <= 150.0
    assert result.bound_ms == 150.0


def test_the_default_bound_is_twice_the_baseline_p95():
    result, _ = run(peaked)
    assert result.bound_ms == 2 * (100.0 + 2.0 * BASELINE.max_batch_size)
    assert result.chosen.measurement.p95_ms <= result.bound_ms


def test_instances_times_threads_never_exceed_the_cores():
    def more_is_better(shape: Shape) -> Measurement:
        return Measurement(rows_per_s=100.0 * shape.instances * (shape.threads or 1) ** 0.9, p95_ms=1.0)

    for cores in (1, 2, 3, 6):
        limits = Limits(cores=cores, max_batch_size=8, max_instances=cores)
        result, measured = run(more_is_better, limits=limits)
        assert all(s.instances * (s.threads or 1) <= cores for s in measured[2:])
        assert all(valid(s, limits) for s in measured[2:])
        assert result.chosen.shape.instances * result.chosen.shape.threads <= cores


def test_a_model_without_a_threads_parameter_tunes_instances_only():
    baseline = Shape(8, 500, (), 1, None)

    def instances_win(shape: Shape) -> Measurement:
        return Measurement(rows_per_s=100.0 * shape.instances, p95_ms=1.0)

    result, measured = run(instances_win, limits=Limits(cores=4, max_batch_size=8, max_instances=4), baseline=baseline)
    assert {s.threads for s in measured} == {None}
    assert result.chosen.shape.instances == 4


def test_a_failed_candidate_never_wins():
    def broken_big_batches(shape: Shape) -> Measurement:
        if shape.max_batch_size > 8:
            return Measurement(1e9, 1.0, error="load failed: out of memory")
        return Measurement(100.0, 1.0)

    result, _ = run(broken_big_batches)
    assert result.chosen.shape.max_batch_size <= 8
    assert result.chosen.measurement.ok


def test_a_baseline_that_does_not_serve_stops_the_search():
    with pytest.raises(SearchError, match="does not serve: load failed"):
        run(lambda shape: Measurement(0.0, 0.0, error="load failed: no model.py"))


def test_preferred_sizes_follow_the_batch_size():
    baseline = Shape(16, 1000, (16,), 1, None)

    def bigger_batches(shape: Shape) -> Measurement:
        return Measurement(rows_per_s=10.0 * shape.max_batch_size + (1.0 if shape.preferred else 0.0), p95_ms=1.0)

    result, measured = run(
        bigger_batches, limits=Limits(cores=1, max_batch_size=64, max_instances=1), baseline=baseline
    )
    assert result.chosen.shape.max_batch_size == 64
    assert all(max(s.preferred, default=0) <= s.max_batch_size for s in measured)
    assert (32,) in {s.preferred for s in measured if s.max_batch_size == 32}


def test_a_shape_is_measured_with_the_calls_the_control_plane_packs_for_it():
    """Its largest preferred batch size, else its max: what `manage.py tune_model` stores as call_rows."""
    assert BASELINE.call_rows == 8
    assert replace(BASELINE, max_batch_size=64, preferred=(16, 32)).call_rows == 32
