"""Property tests for the fleet-size planner: one property per rule in fleet/sizing/planner.py's docstring, stated from
the inputs (independent restatements in sizing_strategies.py), never from the planner's own helpers."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.fleet.sizing.planner import plan_fleet
from controlplane.fleet.sizing.types import ModelBacklog, PoolLimits, PoolObservation, SizingParams
from tests.fleet.sizing_strategies import CASES, NOW, SETTINGS, deadline_need


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture (pytest-django): the planner touches no storage."""
    return None


def _asleep(case, pool) -> bool:
    """The one case where a pool may stay below its work: at zero, nothing running, backlog under the
    activation threshold (known throughput only) and no deadline at risk."""
    busy = [b for b in case.in_pool(pool.pool) if b.busy]
    quiet = all(b.in_flight == 0 and b.units_per_second_per_instance > 0 for b in busy)
    work_s = sum(b.work_units / b.units_per_second_per_instance for b in busy if b.units_per_second_per_instance)
    return case.ref(pool.pool) == 0 and quiet and work_s <= case.params.activation_work_s and not pool.deadline_risk


@SETTINGS
@given(CASES)
def test_within_bounds(case):
    out = case.run()
    assert [p.pool for p in out.pools] == sorted(
        {b.pool for b in case.backlogs} | {o.pool for o in case.observations} | {lim.pool for lim in case.limits}
    )
    for p in out.pools:
        lim = case.limit(p.pool)
        assert lim.min_servers <= p.desired_servers <= lim.max_servers, p
    assert case.params.min_workers <= out.desired_workers <= case.params.max_workers


@SETTINGS
@given(CASES, st.sampled_from([1.0, 1.5, 2.0, 10.0, 1_000.0]))
def test_monotone_in_backlog(case, factor):
    before = {p.pool: p.desired_servers for p in case.run().pools}
    after = case.scaled(factor).run()
    for p in after.pools:
        assert p.desired_servers >= before[p.pool], (p, before[p.pool])


@SETTINGS
@given(CASES)
def test_never_below_what_the_deadlines_need_unless_capped_or_asleep(case):
    for p in case.run().pools:
        k = case.obs(p.pool).instances_per_server
        need = sum(deadline_need(b, k, case.params.startup_s) for b in case.in_pool(p.pool))
        floor = min(max(0, math.ceil(need - 1e-9)), case.limit(p.pool).max_servers)
        assert p.desired_servers >= floor or _asleep(case, p), (p, need)


@SETTINGS
@given(CASES)
def test_zero_only_when_idle(case):
    for p in case.run().pools:
        if p.desired_servers == 0:
            busy = any(b.busy for b in case.in_pool(p.pool))
            assert not busy or _asleep(case, p), p
            if case.params.activation_work_s == 0 and all(b.units_per_second_per_instance for b in case.backlogs):
                assert not any(b.work_units > 0 for b in case.in_pool(p.pool)) or case.ref(p.pool) == 0


@SETTINGS
@given(CASES)
def test_no_flapping_under_constant_input(case):
    """Ticks with the same input: each pool's size changes at most once, then holds (a fixed point)."""
    step = max(1.0, case.params.scale_down_cooldown_s / 3)
    history: dict[str, list[int]] = {}
    for _ in range(8):
        out = case.run()
        for p in out.pools:
            history.setdefault(p.pool, []).append(p.desired_servers)
        case = case.fed_back(out, step)
    for pool, sizes in history.items():
        changes = sum(1 for a, b in itertools.pairwise(sizes) if a != b)
        assert changes <= 1, (pool, sizes)
        assert sizes[-1] == sizes[-2], (pool, sizes)


@SETTINGS
@given(CASES)
def test_scale_down_is_slow_and_waits_for_draining(case):
    for p in case.run().pools:
        ref, obs = case.ref(p.pool), case.obs(p.pool)
        if p.desired_servers < ref:
            since = obs.previous.below_since if obs.previous and obs.previous.below_since is not None else NOW
            assert NOW - since >= case.params.scale_down_cooldown_s, p
            assert obs.draining == 0 and not p.deadline_risk, p


@SETTINGS
@given(CASES)
def test_scale_up_is_immediate_when_a_deadline_is_at_risk(case):
    for p in case.run().pools:
        ref, lim = case.ref(p.pool), case.limit(p.pool)
        target = min(max(math.ceil(p.need_servers - 1e-9), lim.min_servers), lim.max_servers)
        if p.deadline_risk and target > ref:
            assert p.desired_servers == target, p


@SETTINGS
@given(CASES, st.randoms(use_true_random=False))
def test_independent_of_input_order(case, rng: random.Random):
    shuffled = replace(
        case,
        backlogs=tuple(rng.sample(case.backlogs, len(case.backlogs))),
        observations=tuple(rng.sample(case.observations, len(case.observations))),
        limits=tuple(rng.sample(case.limits, len(case.limits))),
    )
    assert shuffled.run() == case.run()


# -- worked examples: the rules one at a time ------------------------------------------------------------

PARAMS = SizingParams(now=NOW, drain_horizon_s=300, startup_s=60, headroom=1.0, scale_down_cooldown_s=300)
FLEET = (PoolLimits("default", 0, 8),)


def _one(backlogs, obs: PoolObservation, params: SizingParams = PARAMS):
    return plan_fleet(backlogs, [obs], FLEET, params).pools[0]


def test_a_flood_with_a_tight_deadline_scales_up_at_once_past_the_hysteresis_band():
    # 10 servers' worth over 160 s minus the 60 s startup: 4,000 instance-s / 100 s = 40 → capped at 8.
    flood = ModelBacklog("m", work_units=40_000, units_per_second_per_instance=10, deadlines=((160.0, 40_000.0),))
    pool = _one([flood], PoolObservation("default", servers=1))
    assert pool.deadline_risk and pool.desired_servers == 8


def test_an_idle_pool_scales_to_zero_only_after_the_cooldown_and_the_first_work_wakes_it():
    idle = PoolObservation("default", servers=2)
    first = _one([], idle)
    assert first.desired_servers == 2 and first.memory.below_since == NOW
    later = _one([], replace(idle, previous=first.memory), replace(PARAMS, now=NOW + 300))
    assert later.desired_servers == 0
    asleep = replace(idle, servers=0, previous=later.memory)
    one_line = ModelBacklog("m", work_units=1, units_per_second_per_instance=10, deadlines=((86_400.0, 1.0),))
    assert _one([one_line], asleep).desired_servers == 1
    lazy = replace(PARAMS, activation_work_s=60.0)  # wakes only past a minute of work (or a deadline at risk)
    assert _one([one_line], asleep, lazy).desired_servers == 0


def test_no_scale_down_while_servers_are_saturated_or_still_draining():
    small = ModelBacklog("m", work_units=10, units_per_second_per_instance=10, deadlines=((86_400.0, 10.0),))
    prev = replace(PoolObservation("default", servers=4), previous=None)
    late = replace(PARAMS, now=NOW + 10_000)
    base = _one([small], prev)
    assert base.desired_servers == 4  # cooldown starts now
    cooled = replace(prev, previous=replace(base.memory, below_since=NOW - 1_000))
    assert _one([small], cooled, late).desired_servers == 1
    assert _one([small], replace(cooled, queue_ms=2_000.0), late).desired_servers == 4
    assert _one([small], replace(cooled, gpu_utilization=0.99), late).desired_servers == 4
    assert _one([small], replace(cooled, draining=1), late).desired_servers == 4


def test_gpu_memory_sets_a_floor_for_the_busy_models():
    models = [
        ModelBacklog(f"m{i}", work_units=1, units_per_second_per_instance=1e6, memory_per_instance_bytes=10)
        for i in range(5)
    ]
    assert _one(models, PoolObservation("default", servers=1, memory_per_server_bytes=16)).desired_servers == 4
