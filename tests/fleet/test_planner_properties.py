"""Property tests for the placement planner: one property per rule in the planner's docstring.

Memory is in abstract units (the planner only compares integers). Scenarios come in two flavours:
``clean`` current placements are feasible and valid (fit in memory, respect pins and max_instances) so
rules about what the planner must *keep* can be stated exactly; ``messy`` ones may be overcommitted or
violate pins, to check the planner still produces a safe plan from a bad starting point.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

from controlplane.fleet.placement.planner import diff_placements, plan
from controlplane.fleet.placement.types import (
    ChangeKind,
    Gpu,
    ModelDemand,
    ModelProfile,
    Placement,
    PlannerParams,
    Server,
)
from tests.fleet.planner_strategies import CLEAN, MESSY, NOW, SETTINGS, C, D, H, Scenario, U, want


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture, which needs pytest-django; the planner touches no storage,
    so this module also runs with ``-p no:django``."""
    return None


@SETTINGS
@given(MESSY)
def test_never_exceeds_gpu_memory(sc):
    out = sc.run()
    cap, used = sc.cap(), sc.used(out.placements)
    for gid, u in used.items():
        assert u == 0 or u <= cap[gid], (gid, u, cap[gid])


@SETTINGS
@given(MESSY)
def test_server_states(sc):
    out = sc.run()
    cur = defaultdict(int)
    for p in sc.current:
        cur[p.key] += p.instances
    for p in out.placements:
        state = sc.state(p.server_id)
        assert state is not U
        if state in (C, D):  # nothing new, nothing bigger
            assert p.instances <= cur[p.key]
        if state is D:  # kept only while the model has no other capacity
            assert sc.count(out.placements, p.model) == 0


@SETTINGS
@given(MESSY)
def test_gang_and_pins(sc):
    out = sc.run()
    gpu_ids = {(g.server_id, g.index) for g in sc.gpus}
    for p in out.placements:
        prof = sc.prof(p.model)
        assert len(p.gpus) == prof.gpus_per_instance
        assert all((p.server_id, i) in gpu_ids for i in p.gpus)
        assert prof.pin_server in (None, p.server_id)
        assert not prof.pin_gpus or set(p.gpus) <= set(prof.pin_gpus)
        assert sc.pool(p.server_id) == prof.pool


@SETTINGS
@given(CLEAN)
def test_work_gets_an_instance_if_it_fits_anywhere(sc):
    out = sc.run()
    cap, used = sc.cap(), sc.used(out.placements)
    evictable = defaultdict(int)  # lower bound: idle models with min_instances=0 can always be evicted
    for p in out.placements:
        prof = sc.prof(p.model)
        if not sc.demand(p.model).busy and prof.min_instances == 0:
            for i in p.gpus:
                evictable[(p.server_id, i)] += p.instances * prof.memory_per_instance_bytes
    for prof in sc.profiles:
        if not sc.demand(prof.model).busy or sc.count(out.placements, prof.model):
            continue
        for s in sc.servers:
            if s.state is not H or prof.pin_server not in (None, s.server_id) or s.pool != prof.pool:
                continue
            room = [
                g.index
                for g in sc.gpus
                if g.server_id == s.server_id
                and (not prof.pin_gpus or g.index in prof.pin_gpus)
                and cap[(s.server_id, g.index)] - used[(s.server_id, g.index)] + evictable[(s.server_id, g.index)]
                >= prof.memory_per_instance_bytes
            ]
            assert len(room) < prof.gpus_per_instance, (prof.model, s.server_id, room, out)


@SETTINGS
@given(CLEAN)
def test_busy_models_are_never_evicted_and_scale_only_to_demand(sc):
    out = sc.run()
    for prof in sc.profiles:
        m, d = prof.model, sc.demand(prof.model)
        n_all = sc.count(out.placements, m, (H, C, D))
        assert n_all <= prof.max_instances
        c_sched, c_all = sc.count(sc.current, m), sc.count(sc.current, m, (H, C, D))
        if d.busy and c_sched:
            assert sc.count(out.placements, m) >= 1
        if d.pending_lines and d.lines_per_second_per_instance:
            _, w = want(sc, m)
            assert n_all <= max(w, c_all)
            assert sc.count(out.placements, m) >= min(c_sched, w)


@SETTINGS
@given(CLEAN)
def test_idle_models_scale_to_min_after_ttl_and_never_grow(sc):
    out = sc.run()
    for prof in sc.profiles:
        d = sc.demand(prof.model)
        if d.busy:
            continue
        n = sc.count(out.placements, prof.model, (H, C, D))
        c_sched = sc.count(sc.current, prof.model)
        if d.last_active_at is None or NOW - d.last_active_at >= sc.params.idle_ttl_s:
            assert n <= prof.min_instances
        else:
            assert n <= max(c_sched, prof.min_instances)
        # Evictions never go below min_instances, and an idle model is loaded only to reach that floor
        # (an evicted idle model is not re-placed elsewhere).
        assert sc.count(out.placements, prof.model) >= min(c_sched, prof.min_instances)
        grew = [c for c in out.changes if c.model == prof.model and c.after > c.before]
        assert not grew or c_sched < prof.min_instances, grew


@st.composite
def crowded_gpu(draw):
    """One healthy server's GPU full of idle models of distinct ages (within their TTL, so nothing shrinks by
    it), some above their min_instances; a busy model arrives that fits only once some of them go."""
    n_idle = draw(st.integers(2, 4))  # at most 4 models × 2 instances × 2 units: they fit in the GPU's 16
    profiles = [
        ModelProfile(f"idle{j}", draw(st.integers(1, 2)), 5, 1, draw(st.sampled_from([0, 0, 1])), 2)
        for j in range(n_idle)
    ]
    ages = draw(st.permutations(range(n_idle)))
    demands = [ModelDemand(p.model, 0, 10, NOW - 10 * (1 + age)) for p, age in zip(profiles, ages, strict=True)]
    current = [Placement(p.model, "s0", (0,), draw(st.integers(1, 2))) for p in profiles]
    used = sum(p.instances * prof.memory_per_instance_bytes for p, prof in zip(current, profiles, strict=True))
    free = 16 - used
    profiles.append(ModelProfile("hot", draw(st.integers(free + 1, 16)), 5, 1, 0, 1))  # up to the whole GPU
    demands.append(ModelDemand("hot", 50_000, 10, NOW, 0))
    params = PlannerParams(now=NOW, idle_ttl_s=3_600)
    return Scenario(tuple(demands), (Server("s0"),), (Gpu("s0", 0, 16),), tuple(profiles), tuple(current), params)


# Crowded GPUs: in the general mix (CLEAN) an eviction beside a kept idle model came up in 1-5 of 150 examples.
EVICTIONS = crowded_gpu()


def lru_checks(sc, out) -> list[tuple[str, str, tuple[str, tuple[int, ...]]]]:
    """The docstring's rule "idle models are evicted least recently used first, never below their
    min_instances", as pairs to check: (lost, kept, where) for each idle model ``lost`` that lost instances at
    ``where`` although its TTL has not passed (an eviction), and each other idle model ``kept`` that still has
    instances there."""
    before = {p.key: p.instances for p in sc.current}
    after = {p.key: p.instances for p in out.placements}

    def idle_within_ttl(m):
        d = sc.demand(m)
        return not d.busy and d.last_active_at is not None and NOW - d.last_active_at < sc.params.idle_ttl_s

    checks = []
    for (lost, sid, gpus), n in before.items():
        if sc.state(sid) is not H or not idle_within_ttl(lost) or after.get((lost, sid, gpus), 0) >= n:
            continue
        for kept, ksid, kgpus in after:
            if (ksid, kgpus) == (sid, gpus) and kept != lost and idle_within_ttl(kept):
                checks.append((lost, kept, (sid, gpus)))
    return checks


@SETTINGS
@given(EVICTIONS)
def test_eviction_takes_least_recently_used_idle_model_first(sc):
    out = sc.run()
    checks = lru_checks(sc, out)
    event("an eviction beside an idle model kept" if checks else "no such eviction")
    assume(checks)
    for lost, kept, where in checks:
        # What stays is used more recently than what went, unless it is held by its min_instances.
        newer = sc.demand(kept).last_active_at > sc.demand(lost).last_active_at
        at_min = sc.count(out.placements, kept) <= sc.prof(kept).min_instances
        assert newer or at_min, (lost, kept, where, out)


def test_the_eviction_property_reaches_its_assert_in_most_examples():
    """The property above is only as good as the examples that reach its assert: most must."""
    reached: list[bool] = []

    @SETTINGS
    @given(EVICTIONS)
    def probe(sc):
        reached.append(bool(lru_checks(sc, sc.run())))

    probe()
    share = sum(reached) / len(reached)
    print(f"eviction property: assert reached in {share:.0%} of {len(reached)} examples")
    assert share >= 0.3, share


@st.composite
def within_the_band(draw):
    """A model with c instances on healthy servers and a backlog whose exact need P / (r * T) lies within the
    hysteresis band around c (|need - c| <= h * c), as the planner's docstring states the rule: keep c."""
    sc = draw(CLEAN)
    movable = sorted({p.model for p in sc.current if sc.state(p.server_id) is H})
    assume(movable)
    m = draw(st.sampled_from(movable))
    # Relocation off other servers is not a demand change.
    assume(all(sc.state(p.server_id) is H for p in sc.current if p.model == m))
    prof, c = sc.prof(m), sc.count(sc.current, m)
    assume(max(prof.min_instances, 1) <= c <= prof.max_instances)
    h, T = sc.params.hysteresis, sc.params.interval_s
    rate = draw(st.sampled_from([5, 50, 500]))
    need = draw(st.floats(max(c * (1 - h), 1 / (rate * T)), c * (1 + h)))  # instances the backlog needs
    pending = math.floor(need * rate * T)  # whole lines: at most one line short of ``need``
    assume(pending >= 1 and abs(pending / (rate * T) - c) <= h * c)
    demand = ModelDemand(m, pending, rate, NOW, 0)
    return replace(sc, demands=(*(d for d in sc.demands if d.model != m), demand)), m


@SETTINGS
@given(within_the_band())
def test_hysteresis_small_demand_change_moves_nothing(case):
    sc, m = case
    event("kept inside the band")
    out = sc.run()
    # Its capacity is kept; the only way its placements change is a consolidation move made for another
    # model (make-before-break, tagged move_for), which relocates instances without changing their number.
    assert sc.count(out.placements, m) == sc.count(sc.current, m)
    own = [c for c in out.changes if c.model == m]
    assert all(c.move_for and c.move_for != m for c in own), own
    if not own:
        assert sorted(p for p in out.placements if p.model == m) == sorted(p for p in sc.current if p.model == m)


@SETTINGS
@given(CLEAN)
def test_growth_pays_back_its_load_time(sc):
    out = sc.run()
    T = sc.params.interval_s
    for prof in sc.profiles:
        d = sc.demand(prof.model)
        n = sc.count(out.placements, prof.model, (H, C, D))
        base = max(sc.count(sc.current, prof.model, (H, C, D)), prof.min_instances, 1)
        if n > base:
            r = d.lines_per_second_per_instance
            assert d.pending_lines and r
            assert min(T, d.pending_lines / (n * r)) > prof.load_time_s


@SETTINGS
@given(
    st.integers(1, 200_000),
    st.sampled_from([1, 10, 100]),
    st.sampled_from([0, 1, 10, 100]),
    st.integers(0, 2),
    st.integers(1, 8),
    st.sampled_from([10, 60, 600]),
)
def test_instances_proportional_to_demand_with_ample_memory(pending, rate, load, lo, hi, interval):
    lo = min(lo, hi)
    prof = ModelProfile("m", 1, load, min_instances=lo, max_instances=hi)
    out = plan(
        [ModelDemand("m", pending, rate, NOW)],
        [Server("s")],
        [Gpu("s", 0, 1000)],
        [prof],
        [],
        PlannerParams(now=NOW, interval_s=interval),
    )
    floor = max(lo, 1)
    w = min(max(math.ceil(pending / (rate * interval)), floor), hi)
    worth = [n for n in range(1, w + 1) if min(interval, pending / (n * rate)) > load]
    assert sum(p.instances for p in out.placements) == max(floor, max(worth, default=0))


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 60)),
        min_size=1,
        max_size=8,
        unique_by=lambda t: t[:2],
    ),
    st.integers(1, 40),
)
def test_best_fit_picks_the_tightest_gpu(gpu_specs, need):
    gpus = [Gpu(f"s{s}", i, 40 + 40 * (i % 2), min(used, 40)) for s, i, used in gpu_specs]
    servers = [Server(sid) for sid in sorted({g.server_id for g in gpus})]
    out = plan([ModelDemand("m", 10, 1, NOW)], servers, gpus, [ModelProfile("m", need, 0)], [], PlannerParams(now=NOW))
    leftovers = [g.total_memory_bytes - g.used_by_others_bytes - need for g in gpus]
    fitting = [x for x in leftovers if x >= 0]
    if not fitting:
        assert out.placements == ()
        return
    (p,) = out.placements
    g = next(g for g in gpus if (g.server_id, g.index) == (p.server_id, p.gpus[0]))
    assert g.total_memory_bytes - g.used_by_others_bytes - need == min(fitting)


@SETTINGS
@given(MESSY, st.randoms(use_true_random=False))
def test_deterministic_and_independent_of_input_order(sc, rnd):
    def shuffled(xs):
        xs = list(xs)
        rnd.shuffle(xs)
        return xs

    first = sc.run()
    again = plan(
        shuffled(sc.demands),
        shuffled(sc.servers),
        shuffled(sc.gpus),
        shuffled(sc.profiles),
        shuffled(sc.current),
        sc.params,
    )
    assert again == first
    assert list(first.placements) == sorted(first.placements)


@SETTINGS
@given(MESSY)
def test_idempotent(sc):
    first = sc.run()
    second = sc.run(current=first.placements)
    assert second.placements == first.placements
    assert second.changes == ()


@SETTINGS
@given(MESSY)
def test_changes_are_make_before_break_and_reach_the_target(sc):
    out = sc.run()
    kinds = [c.kind for c in out.changes]
    adds = [k in (ChangeKind.LOAD, ChangeKind.SCALE_UP) for k in kinds]
    assert adds == sorted(adds, reverse=True)  # every addition precedes every removal
    state = defaultdict(int)
    for p in sc.current:
        state[p.key] += p.instances
    for c in out.changes:
        key = (c.model, c.server_id, c.gpus)
        assert state[key] == c.before and c.reason
        state[key] = c.after
    assert {k: v for k, v in state.items() if v} == {p.key: p.instances for p in out.placements}
    assert diff_placements(out.placements, out.placements) == []
