"""The benchmark's ceiling is the best of a sweep, not one fixed shape (bench/ceiling.py)."""

from __future__ import annotations

from bench.ceiling import PADDING_CUT, Config, sweep_configs


def test_sweep_covers_batch_sizes_threads_and_order():
    configs = sweep_configs(max_batch=64, cores=2)
    assert {c.batch_size for c in configs} == {8, 16, 32, 64}
    assert {c.threads for c in configs} == {1, 2}
    assert {(c.sort_by_length, c.max_padding) for c in configs} == {(True, None), (True, PADDING_CUT), (False, None)}
    assert len(configs) == len(set(configs)) == 4 * 2 * 3
    # the served shape (max batch, the served threads, sorted) is always one of the candidates
    assert Config(64, 2, True) in configs


def test_sweep_reaches_an_odd_max_batch_and_all_cores():
    configs = sweep_configs(max_batch=48, cores=4)
    assert max(c.batch_size for c in configs) == 48
    assert {c.threads for c in configs} == {1, 2, 3, 4}
