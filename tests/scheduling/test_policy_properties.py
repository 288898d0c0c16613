"""Property tests for the scheduler's ordering policy: one property per rule in policy.py's docstring.

Pure rank() properties draw candidate sets directly; fairness, arrival and aging properties run the
discrete-event simulator in policy_sim.py (k slots, each claim takes the best-ranked candidate's next
shard, a shard of W units runs W / rate seconds, charge at claim). Work is in abstract units.

Fair-share bound (the simulations' two tenants A and B, weights wA and wB, shards of 1..S units). Both
start with no share, so both start at V. While both are backlogged in the same tier, each claim goes to
the tenant with the smaller virtual time and moves it by at most S / w, and V never passes either of them
(V is the served start tag, the smaller one). By induction |vA - vB| <= max(S/wA, S/wB) after every claim:
if the served tenant overtakes, it does so by at most its own S / w; if not, the gap shrank. Without decay
v = v0 + served / w with v0 equal, so

    |servedA/wA - servedB/wB| <= max(S/wA, S/wB) <= S * (1/wA + 1/wB)

(the right-hand side is the classic SFQ bound for arbitrary start tags). With decay every clock shrinks by
the same factor, so the invariant still holds on decayed values; a charge made t seconds before the end is
worth 2 ** (-t / H) >= 2 ** (-T / H) of itself there (T the window, H the half-life), which loosens it to

    |servedA/wA - servedB/wB| <= max(S/wA, S/wB) + (2 ** (T / H) - 1) * max(servedA/wA, servedB/wB)

i.e. about 7% of the larger share on top when H >= 10 T.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from controlplane.scheduling.policy import (
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
    tier,
)
from tests.scheduling.policy_sim import (
    CONFIGS,
    NO_AGING,
    NOW,
    PRIORITIES,
    RATES,
    SETTINGS,
    SHARD_SIZES,
    SLOTS,
    SYSTEM_CLOCKS,
    WEIGHTS,
    Batch,
    candidates,
    cycled,
    shares,
    simulate,
)

_CLASS_ORDER = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}
_EPS = 1e-9


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture, which needs pytest-django; the policy touches no storage,
    so this module also runs with ``-p no:django``."""
    return None


def _ids(cands):
    return [c.batch_id for c in cands]


# -- 1. work-conserving, deterministic --------------------------------------------------------------------


@SETTINGS
@given(candidates(), shares(), SYSTEM_CLOCKS, CONFIGS)
def test_rank_keeps_every_candidate_whatever_the_input_order(cands, shares, system, config):
    ranked = rank(cands, shares, system, NOW, config)
    assert sorted(_ids(ranked)) == sorted(_ids(cands))
    assert _ids(rank(cands[::-1], shares, system, NOW, config)) == _ids(ranked)


@SETTINGS
@given(candidates(), shares(), SYSTEM_CLOCKS, CONFIGS.filter(lambda c: not c.fifo))
def test_rank_is_tier_then_virtual_time(cands, shares, system, config):
    ranked = rank(cands, shares, system, NOW, config)
    keys = [(tier(c, NOW, config), effective_vtime(shares.get(c.tenant_id), system, NOW, config)) for c in ranked]
    for (t1, v1), (t2, v2) in itertools.pairwise(keys):
        assert t1 <= t2
        assert t1 != t2 or t1 is Tier.URGENT or v1 <= v2


# -- 2. strict class order --------------------------------------------------------------------------------


@SETTINGS
@given(candidates(expiry=st.just(math.inf)), shares(), SYSTEM_CLOCKS)
def test_without_aging_or_deadlines_classes_are_strict(cands, shares, system):
    ranked = rank(cands, shares, system, NOW, NO_AGING)
    classes = [_CLASS_ORDER[c.priority] for c in ranked]
    assert classes == sorted(classes)


# -- 3. weighted fair share -------------------------------------------------------------------------------


def _two_tenants(sizes_a, sizes_b, w_a, w_b, slots, rate, config, work=1_000.0):
    until = work / (slots * rate)
    n = int(work) + 1  # shards are >= 1 unit: enough to stay backlogged past ``until``
    batches = [
        Batch("a", 1, Priority.NORMAL, 0.0, cycled(sizes_a, n)),
        Batch("b", 2, Priority.NORMAL, 0.0, cycled(sizes_b, n)),
    ]
    sim = simulate(batches, {1: w_a, 2: w_b}, slots=slots, rate=rate, config=config, until=until)
    assert sim.runnable_at_end == {"a", "b"}  # both backlogged for the whole window
    return sim, until


@SETTINGS
@given(SHARD_SIZES, SHARD_SIZES, WEIGHTS, WEIGHTS, SLOTS, RATES)
def test_weighted_fair_share_without_decay(sizes_a, sizes_b, w_a, w_b, slots, rate):
    sim, _ = _two_tenants(sizes_a, sizes_b, w_a, w_b, slots, rate, NO_AGING)
    big = max(sizes_a + sizes_b)
    gap = abs(sim.served(1) / w_a - sim.served(2) / w_b)
    assert gap <= max(big / w_a, big / w_b) + _EPS
    assert gap <= big * (1 / w_a + 1 / w_b)


@SETTINGS
@given(SHARD_SIZES, SHARD_SIZES, WEIGHTS, WEIGHTS, SLOTS, RATES, st.sampled_from([10.0, 20.0, 100.0]))
def test_weighted_fair_share_with_slow_decay(sizes_a, sizes_b, w_a, w_b, slots, rate, factor):
    window = 1_000.0 / (slots * rate)
    config = replace(NO_AGING, half_life_seconds=factor * window)
    sim, until = _two_tenants(sizes_a, sizes_b, w_a, w_b, slots, rate, config)
    big = max(sizes_a + sizes_b)
    a, b = sim.served(1) / w_a, sim.served(2) / w_b
    loosening = 2 ** (until / config.half_life_seconds) - 1
    assert abs(a - b) <= max(big / w_a, big / w_b) + loosening * max(a, b) + _EPS


# -- 4. late arrival, 5. no banking -----------------------------------------------------------------------


@SETTINGS
@given(
    SHARD_SIZES,
    SHARD_SIZES,
    WEIGHTS,
    WEIGHTS,
    SLOTS,
    st.sampled_from([1.0, 2.5]),
    st.floats(1.0, 200.0),
    st.sampled_from([math.inf, 600.0, 3_600.0]),
)
def test_late_arrival_gets_the_very_next_claim(sizes_a, sizes_b, w_a, w_b, slots, rate, arrives, half_life):
    big = max(sizes_a + sizes_b)
    until = arrives + 2 * big / rate + 1
    batches = [
        Batch("a1", 1, Priority.NORMAL, 0.0, cycled(sizes_a, int(slots * rate * until) + 1)),
        Batch("a2", 1, Priority.NORMAL, 0.0, cycled(sizes_a, 5)),
        Batch("late", 2, Priority.NORMAL, arrives, cycled(sizes_b, 5)),
    ]
    config = replace(NO_AGING, half_life_seconds=half_life)
    sim = simulate(batches, {1: w_a, 2: w_b}, slots=slots, rate=rate, config=config, until=until)
    after = [c for c in sim.claims if c.at >= arrives]
    assert any(c.tenant_id == 1 for c in sim.claims if c.at < arrives)
    assert after and after[0].batch_id == "late"


@SETTINGS
@given(
    SHARD_SIZES,
    SHARD_SIZES,
    WEIGHTS,
    WEIGHTS,
    SLOTS,
    st.sampled_from([1.0, 2.5]),
    st.floats(100.0, 400.0),
    st.sampled_from([math.inf, 60.0, 3_600.0]),
)
def test_returning_tenant_banks_no_credit(sizes_a, sizes_b, w_a, w_b, slots, rate, returns, half_life):
    """B is served a little at the start, idles while A is served alone, then comes back: before A's next
    claim, B gains at most S/wA + S/wB of virtual time (A leads V by at most one shard S / wA; the claim
    that overtakes A adds at most S / wB)."""
    big = max(sizes_a + sizes_b)
    bound = big / w_a + big / w_b
    until = returns + bound * w_b / rate + 2 * big / rate + 1
    batches = [
        Batch("a", 1, Priority.NORMAL, 0.0, cycled(sizes_a, int(slots * rate * until) + 1)),
        Batch("b-early", 2, Priority.NORMAL, 0.0, cycled(sizes_b, 2)),
        Batch("b-back", 2, Priority.NORMAL, returns, cycled(sizes_b, int(bound * w_b) + 5)),
    ]
    config = replace(NO_AGING, half_life_seconds=half_life)
    sim = simulate(batches, {1: w_a, 2: w_b}, slots=slots, rate=rate, config=config, until=until)
    after = [c for c in sim.claims if c.at >= returns]
    first_a = next(i for i, c in enumerate(after) if c.tenant_id == 1)  # A does get a claim
    burst = sum(c.work for c in after[:first_a])
    assert burst / w_b <= bound + _EPS


# -- 6. aging ---------------------------------------------------------------------------------------------


@SETTINGS
@given(
    SHARD_SIZES,
    SHARD_SIZES,
    WEIGHTS,
    SLOTS,
    st.sampled_from([1.0, 2.5]),
    st.sampled_from([5.0, 20.0, 60.0]),
    st.floats(0.0, 50.0),
    st.sampled_from([math.inf, 600.0]),
)
def test_aging_bounds_the_gap_of_low_work_under_a_high_stream(
    sizes_high, sizes_low, w_low, slots, rate, aging, arrives, half_life
):
    max_duration = max(sizes_high + sizes_low) / rate
    until = arrives + 4 * (aging + max_duration)
    n_high = int(slots * rate * until) + 1
    batches = [
        Batch("high-1", 1, Priority.HIGH, 0.0, cycled(sizes_high, n_high)),
        Batch("high-2", 2, Priority.HIGH, 0.0, cycled(sizes_high[::-1], n_high)),
        Batch("low", 3, Priority.LOW, arrives, cycled(sizes_low, 200)),
    ]
    config = PolicyConfig(aging_seconds=aging, half_life_seconds=half_life)
    sim = simulate(batches, {1: 1.0, 2: 2.0, 3: w_low}, slots=slots, rate=rate, config=config, until=until)
    served_at = [arrives] + [c.at for c in sim.claims if c.batch_id == "low"]
    assert len(served_at) >= 4
    for before, after in itertools.pairwise(served_at):
        assert after - before <= aging + max_duration + _EPS
    assert "low" in sim.runnable_at_end


# -- 7. deadlines -----------------------------------------------------------------------------------------


@SETTINGS
@given(candidates(priorities=PRIORITIES), shares(), SYSTEM_CLOCKS, CONFIGS.filter(lambda c: not c.fifo))
def test_deadline_urgent_first_least_slack_first(cands, shares, system, config):
    ranked = rank(cands, shares, system, NOW, config)
    urgent = [deadline_at_risk(c, NOW, config) for c in ranked]
    assert urgent == sorted(urgent, reverse=True)
    slacks = [slack(c, NOW) for c, u in zip(ranked, urgent, strict=True) if u]
    assert slacks == sorted(slacks)


# -- 8. fifo ----------------------------------------------------------------------------------------------


@SETTINGS
@given(candidates(), shares(), SYSTEM_CLOCKS, CONFIGS, st.data())
def test_fifo_ignores_priority_tenants_and_deadlines(cands, shares, system, config, data):
    config = replace(config, fifo=True)
    ranked = rank(cands, shares, system, NOW, config)
    assert _ids(ranked) == _ids(sorted(cands, key=lambda c: (c.created_at, c.batch_id)))
    shuffled = [
        replace(c, priority=data.draw(PRIORITIES), tenant_id=data.draw(st.integers(1, 3)), expires_at=NOW)
        for c in cands
    ]
    assert _ids(rank(shuffled, {}, system, NOW, config)) == _ids(ranked)


# -- 9. charge and correct --------------------------------------------------------------------------------

_WORK = st.floats(0.0, 10_000.0)
_LATER = st.floats(0.0, 100_000.0)


@st.composite
def _maybe_share(draw):
    if draw(st.booleans()):
        return None
    return TenantShare(1, Clock(draw(st.floats(0.0, 1e6)), draw(st.floats(NOW - 1e5, NOW + 10))), draw(WEIGHTS))


@SETTINGS
@given(_maybe_share(), SYSTEM_CLOCKS, WEIGHTS, _WORK, _WORK, _LATER, CONFIGS)
def test_charge_is_monotonic_and_never_behind_the_system_clock(share, system, weight, w1, w2, later, config):
    small, large = sorted((w1, w2))
    s1, v1 = charge(share, 1, weight, system, small, NOW, config)
    s2, v2 = charge(share, 1, weight, system, large, NOW, config)
    assert 0 <= s1.clock.vtime <= s2.clock.vtime
    assert v1 == v2 and v1.vtime >= decayed(system, NOW, config)
    assert s1.clock.vtime >= v1.vtime
    for t in (NOW, NOW + later):
        assert effective_vtime(s1, v1, t, config) >= decayed(v1, t, config) >= 0


@SETTINGS
@given(_maybe_share(), SYSTEM_CLOCKS, WEIGHTS, _WORK, st.floats(-1e6, 1e6), _LATER, CONFIGS)
def test_correct_never_goes_negative(share, system, weight, work, delta, later, config):
    charged, _ = charge(share, 1, weight, system, work, NOW, config)
    fixed = correct(charged, delta, NOW + later, config)
    assert fixed.clock.vtime >= 0 and fixed.clock.at == NOW + later
    assume(delta >= 0)
    assert fixed.clock.vtime >= decayed(charged.clock, NOW + later, config)
