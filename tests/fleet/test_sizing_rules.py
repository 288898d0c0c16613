"""Worked examples for the fleet-size planner's scale-down rules (fleet/sizing/planner.py), one pool each, with the exact answer.
The property tests (test_sizing_properties.py) draw clocks where a cooldown's start is never far behind ``now``;
these pin the rules where the sampled mutation pass found them unheld (docs/reliability.md)."""

from __future__ import annotations

import pytest

from controlplane.fleet.sizing.planner import plan_fleet
from controlplane.fleet.sizing.types import (
    DeadlineWork,
    ModelBacklog,
    PoolLimits,
    PoolMemory,
    PoolObservation,
    SizingParams,
)

NOW = 10_000.0


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture (pytest-django): the planner touches no storage."""
    return None


def _plan(need: float, servers: int, *, now: float = NOW, below_since: float | None = None, **observed):
    """One busy model whose backlog needs ``need`` servers (drained over 300 s at 0.8 headroom, 1 unit/s)."""
    backlog = ModelBacklog("m", work_units=need * 300 * 0.8, units_per_second_per_instance=1.0)
    obs = PoolObservation("default", servers=servers, previous=PoolMemory(servers, below_since), **observed)
    (pool,) = plan_fleet([backlog], [obs], [PoolLimits("default", 0, 20)], SizingParams(now=now)).pools
    return pool


def test_the_cooldown_runs_from_when_the_need_first_fell_however_long_ago():
    pool = _plan(1.0, 3, below_since=100.0)
    assert pool.desired_servers == 1
    assert pool.reason.endswith("below 3 for 9900s: scaled down"), pool.reason


def test_within_the_cooldown_the_pool_keeps_its_size_and_says_how_long_it_has_waited():
    pool = _plan(1.0, 3, now=250.0, below_since=100.0)
    assert (pool.desired_servers, pool.memory.below_since) == (3, 100.0)
    assert pool.reason.endswith("below 3 for 150s (< 300s cooldown)"), pool.reason


def test_a_busy_pool_within_the_hysteresis_band_keeps_its_size_past_the_cooldown():
    pool = _plan(8.5, 10, below_since=0.0)  # 8.5 is within 20 % of 10
    assert pool.desired_servers == 10
    assert pool.reason.endswith("within 20% of 10: kept (hysteresis)"), pool.reason


def test_only_gpus_above_their_utilisation_target_hold_a_scale_down():
    assert _plan(1.0, 3, below_since=0.0, gpu_utilization=0.2).desired_servers == 1
    held = _plan(1.0, 3, below_since=0.0, gpu_utilization=0.95)
    assert held.desired_servers == 3 and "saturated" in held.reason


def test_a_pool_at_the_size_it_needs_says_so():
    pool = _plan(2.5, 3)
    assert pool.desired_servers == 3
    assert pool.reason.endswith("at the size needed"), pool.reason


def test_work_due_within_the_last_second_is_at_risk_when_it_cannot_finish():
    # 0.8 instance-seconds due in 0.5 s on one server: it cannot be done in time.
    backlog = ModelBacklog("m", work_units=0.8, units_per_second_per_instance=1.0, deadlines=(DeadlineWork(0.5, 0.8),))
    obs = PoolObservation("default", servers=1, previous=PoolMemory(1))
    (pool,) = plan_fleet([backlog], [obs], [PoolLimits("default", 0, 20)], SizingParams(now=NOW)).pools
    assert pool.deadline_risk
