"""Example-based tests for the scheduler's ordering policy (controlplane/scheduling/policy.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controlplane.scheduling.policy import (
    Candidate,
    Clock,
    PolicyConfig,
    Priority,
    TenantShare,
    Tier,
    charge,
    correct,
    deadline_at_risk,
    decayed,
    effective_vtime,
    rank,
    slack,
    start_estimates,
    tier,
)

NOW = 10_000.0
CFG = PolicyConfig()
NO_DECAY = PolicyConfig(half_life_seconds=math.inf)


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture, which needs pytest-django; the policy touches no storage,
    so this module also runs with ``-p no:django``."""
    return None


def cand(batch_id="b", tenant_id=1, priority=Priority.NORMAL, **kw) -> Candidate:
    fields = dict(
        created_at=NOW - 100,
        waiting_since=NOW - 10,
        expires_at=math.inf,
        remaining_work=100.0,
        throughput=10.0,
        next_shard_work=10.0,
    )
    fields.update(kw)
    return Candidate(batch_id=batch_id, tenant_id=tenant_id, priority=priority, **fields)


def share(tenant_id, vtime, at=NOW, weight=1.0) -> TenantShare:
    return TenantShare(tenant_id, Clock(vtime, at), weight)


# -- config --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"aging_seconds": -1.0},
        {"half_life_seconds": 0.0},
        {"half_life_seconds": -60.0},
        {"deadline_fraction": -0.1},
        {"aging_seconds": math.nan},
    ],
)
def test_config_rejects_bad_values(kw):
    with pytest.raises(ValueError):
        PolicyConfig(**kw)


def test_config_takes_a_half_life_under_a_second():
    assert PolicyConfig(half_life_seconds=0.5).half_life_seconds == 0.5


# -- decay and virtual time -------------------------------------------------------------------------------


def test_decayed_halves_every_half_life():
    clock = Clock(80.0, NOW)
    assert decayed(clock, NOW, CFG) == 80.0
    assert decayed(clock, NOW + 3600, CFG) == pytest.approx(40.0)
    assert decayed(clock, NOW + 7200, CFG) == pytest.approx(20.0)


def test_decayed_without_half_life_or_from_the_future():
    assert decayed(Clock(80.0, NOW), NOW + 1e9, NO_DECAY) == 80.0
    assert decayed(Clock(80.0, NOW + 50), NOW, CFG) == 80.0  # now < at reads as now == at


def test_effective_vtime_new_tenant_starts_at_system_clock():
    system = Clock(40.0, NOW - 3600)
    assert effective_vtime(None, system, NOW, CFG) == pytest.approx(20.0)


def test_effective_vtime_is_the_larger_of_tenant_and_system():
    system = Clock(20.0, NOW)
    assert effective_vtime(share(1, 50.0), system, NOW, CFG) == 50.0
    assert effective_vtime(share(1, 5.0), system, NOW, CFG) == 20.0  # idle time banks nothing


# -- deadline, slack and tiers --------------------------------------------------------------------------


def test_slack():
    assert slack(cand(expires_at=NOW + 30, remaining_work=100, throughput=10), NOW) == 20.0
    assert slack(cand(expires_at=NOW + 5, remaining_work=100, throughput=10), NOW) == -5.0
    assert slack(cand(expires_at=NOW + 5, throughput=0), NOW) == math.inf
    assert slack(cand(), NOW) == math.inf  # no expiry


def test_deadline_at_risk_threshold():
    # needs 10 s; at risk once 10 s > 0.5 * time left, i.e. with less than 20 s left
    assert not deadline_at_risk(cand(expires_at=NOW + 20), NOW, CFG)
    assert deadline_at_risk(cand(expires_at=NOW + 19.9), NOW, CFG)
    assert deadline_at_risk(cand(expires_at=NOW - 1), NOW, CFG)  # expired and unfinished


@pytest.mark.parametrize(
    "kw", [{"throughput": 0.0}, {"throughput": -1.0}, {"expires_at": math.inf}, {"remaining_work": 0.0}]
)
def test_deadline_never_at_risk_without_rate_expiry_or_work(kw):
    assert not deadline_at_risk(replace(cand(expires_at=NOW + 1), **kw), NOW, CFG)


def test_an_expired_batch_with_no_work_left_is_not_at_risk():
    # Past its expiry any remaining work is at risk (above); with none left there is nothing to promote.
    assert not deadline_at_risk(cand(expires_at=NOW - 1, remaining_work=0.0), NOW, CFG)


def test_one_unit_left_at_half_a_unit_a_second_is_at_risk():
    # Needs 2 s with 1 s left: neither a slow model nor a small remainder exempts a batch.
    assert deadline_at_risk(cand(expires_at=NOW + 1, remaining_work=1.0, throughput=0.5), NOW, CFG)
    # Needs 1.5 s with 2.5 s left: more than half of it.
    assert deadline_at_risk(cand(expires_at=NOW + 2.5, remaining_work=3.0, throughput=2.0), NOW, CFG)


def test_long_expired_batches_without_a_rate_or_work_left_are_not_at_risk():
    assert not deadline_at_risk(cand(expires_at=NOW - 1000, throughput=-1.0), NOW, CFG)
    assert not deadline_at_risk(cand(expires_at=NOW - 1000, remaining_work=-1.0), NOW, CFG)


def test_slack_below_one_unit_a_second_and_with_fractional_seconds():
    # 3 units at 0.5 a second need 6 s; 5 units at 2 a second need 2.5 s.
    assert slack(cand(expires_at=NOW + 10, remaining_work=3, throughput=0.5), NOW) == 4.0
    assert slack(cand(expires_at=NOW + 10, remaining_work=5, throughput=2), NOW) == 7.5
    assert slack(cand(expires_at=NOW + 10, throughput=-1.0), NOW) == math.inf  # no rate known


def test_tier_by_class_aging_and_deadline():
    fresh = NOW - 10
    assert tier(cand(priority=Priority.HIGH, waiting_since=fresh), NOW, CFG) is Tier.HIGH
    assert tier(cand(priority=Priority.NORMAL, waiting_since=fresh), NOW, CFG) is Tier.NORMAL
    assert tier(cand(priority=Priority.LOW, waiting_since=fresh), NOW, CFG) is Tier.LOW
    assert tier(cand(priority=Priority.LOW, waiting_since=NOW - 599.5), NOW, CFG) is Tier.LOW  # aging: 600 s
    assert tier(cand(priority=Priority.LOW, waiting_since=NOW - 600), NOW, CFG) is Tier.AGED
    assert tier(cand(priority=Priority.NORMAL, waiting_since=NOW - 601), NOW, CFG) is Tier.AGED
    assert tier(cand(priority=Priority.HIGH, waiting_since=NOW - 10_000), NOW, CFG) is Tier.HIGH
    urgent = cand(priority=Priority.LOW, waiting_since=NOW - 10_000, expires_at=NOW + 1)
    assert tier(urgent, NOW, CFG) is Tier.URGENT


def test_the_five_tiers_are_distinct_and_in_order():
    # The queue overview names each batch's tier: two tiers of one value would show one under the other's name.
    assert [t.name for t in sorted(Tier)] == ["URGENT", "AGED", "HIGH", "NORMAL", "LOW"]


# -- rank -----------------------------------------------------------------------------------------------


def test_rank_orders_by_tier_first():
    high = cand("high", priority=Priority.HIGH)
    normal = cand("normal", tenant_id=2)
    low = cand("low", priority=Priority.LOW)
    aged = cand("aged", priority=Priority.LOW, waiting_since=NOW - 700)
    urgent = cand("urgent", priority=Priority.LOW, expires_at=NOW + 5)
    got = rank([low, normal, aged, high, urgent], {}, Clock(0, NOW), NOW, CFG)
    assert [c.batch_id for c in got] == ["urgent", "aged", "high", "normal", "low"]


def test_rank_within_a_tier_least_served_tenant_first():
    shares = {1: share(1, 30.0), 2: share(2, 10.0)}
    a, b, new = cand("a", 1), cand("b", 2), cand("new", 3)
    got = rank([a, b, new], shares, Clock(5.0, NOW), NOW, NO_DECAY)
    assert [c.batch_id for c in got] == ["new", "b", "a"]


def test_rank_ties_break_by_slack_then_created_at_then_id():
    tight = cand("z-tight", expires_at=NOW + 1_000)
    old = cand("y-old", created_at=NOW - 500)
    a, b = cand("a"), cand("b")
    got = rank([b, a, old, tight], {}, Clock(0, NOW), NOW, CFG)
    assert [c.batch_id for c in got] == ["z-tight", "y-old", "a", "b"]


def test_rank_urgent_least_slack_first_even_over_fairness():
    shares = {1: share(1, 0.0), 2: share(2, 1_000.0)}
    roomy = cand("roomy", 1, expires_at=NOW + 15)  # slack 5
    tight = cand("tight", 2, expires_at=NOW + 11)  # slack 1
    got = rank([roomy, tight], shares, Clock(0, NOW), NOW, NO_DECAY)
    assert [c.batch_id for c in got] == ["tight", "roomy"]


def test_rank_fifo_ignores_priority_tenant_and_deadline():
    config = replace(CFG, fifo=True)
    first = cand("2", priority=Priority.LOW, created_at=NOW - 300)
    tie_a = cand("1a", priority=Priority.NORMAL, created_at=NOW - 200)
    tie_b = cand("1b", priority=Priority.HIGH, created_at=NOW - 200, expires_at=NOW + 1)
    got = rank([tie_b, tie_a, first], {1: share(1, 1e9)}, Clock(0, NOW), NOW, config)
    assert [c.batch_id for c in got] == ["2", "1a", "1b"]


def test_rank_empty():
    assert rank([], {}, Clock(0, NOW), NOW, CFG) == []


# -- charge and correct ---------------------------------------------------------------------------------


def test_charge_new_tenant_starts_at_system_clock():
    new, system = charge(None, 7, 2.0, Clock(10.0, NOW - 1), 30.0, NOW, NO_DECAY)
    assert new == TenantShare(7, Clock(25.0, NOW), 2.0)  # 10 + 30 / 2
    assert system == Clock(10.0, NOW)


def test_charge_advances_system_clock_to_start():
    old = share(1, 40.0, at=NOW - 3600, weight=1.0)  # decays to 20
    new, system = charge(old, 1, 4.0, Clock(8.0, NOW - 3600), 8.0, NOW, CFG)
    assert new.clock.vtime == pytest.approx(22.0)  # 20 + 8 / 4 (the weight passed in wins)
    assert new.weight == 4.0
    assert system.vtime == pytest.approx(20.0) and system.at == NOW


def test_charge_lifts_an_idle_tenant_to_the_system_clock():
    new, system = charge(share(1, 1.0), 1, 1.0, Clock(50.0, NOW), 5.0, NOW, NO_DECAY)
    assert new.clock.vtime == 55.0
    assert system.vtime == 50.0


@pytest.mark.parametrize("weight, work", [(0.0, 1.0), (-1.0, 1.0), (1.0, -1.0)])
def test_charge_rejects_bad_weight_or_work(weight, work):
    with pytest.raises(ValueError):
        charge(None, 1, weight, Clock(0, NOW), work, NOW, CFG)


def test_correct_applies_the_measured_difference():
    s = share(1, 40.0, at=NOW - 3600, weight=2.0)
    up = correct(s, 10.0, NOW, CFG)
    assert (up.tenant_id, up.clock.vtime, up.clock.at, up.weight) == (1, pytest.approx(25.0), NOW, 2.0)
    assert correct(s, -10.0, NOW, CFG).clock.vtime == pytest.approx(15.0)
    assert correct(s, -1_000.0, NOW, CFG).clock == Clock(0.0, NOW)  # floor at 0
    assert correct(share(1, 0.0, weight=2.0), 3.0, NOW, CFG).clock.vtime == 1.5  # 3 units at weight 2


# -- start estimates -----------------------------------------------------------------------------------


def test_start_estimates_sum_the_work_ahead():
    ranked = [cand("a", next_shard_work=10), cand("b", next_shard_work=30), cand("c", next_shard_work=5)]
    assert start_estimates(ranked, 10.0) == {"a": 0.0, "b": 1.0, "c": 4.0}


def test_start_estimates_below_one_unit_a_second_and_with_fractional_seconds():
    ranked = [cand("a", next_shard_work=3), cand("b", next_shard_work=5), cand("c")]
    assert start_estimates(ranked, 0.5) == {"a": 0.0, "b": 6.0, "c": 16.0}
    assert start_estimates(ranked, 2.0) == {"a": 0.0, "b": 1.5, "c": 4.0}


def test_start_estimates_unknown_throughput():
    ranked = [cand("a"), cand("b")]
    assert start_estimates(ranked, 0.0) == {"a": 0.0, "b": math.inf}
    assert start_estimates(ranked, -1.0) == {"a": 0.0, "b": math.inf}
    assert start_estimates([], 10.0) == {}


def test_a_promoted_batch_stays_urgent_after_the_risk_passed() -> None:
    config = PolicyConfig()
    relaxed = cand("relaxed", remaining_work=1.0, throughput=1.0, expires_at=1_000.0)
    assert tier(relaxed, 0.0, config) is not Tier.URGENT
    assert tier(replace(relaxed, deadline_promoted=True), 0.0, config) is Tier.URGENT
