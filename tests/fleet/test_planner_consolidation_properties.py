"""Property tests for consolidation (fleet/placement/consolidation.py): room for a large model, made by moving other
models' instances make-before-break.

Fleets here are those consolidation is for: GPUs of 80 units each holding a few busy small models with some
room left, and one large model (one GPU, or a gang of 2 on one server) that fits on no GPU as things stand.
Small models are busy without a throughput estimate, so the planner keeps their size and the only changes
a plan can make are the large model's placement and the moves for it. Memory is in GiB-like integer units.

``hypothesis.event`` / ``target`` show in ``--hypothesis-show-statistics`` how often the consolidation
branch is reached; properties that only speak of moves ``assume`` there were some, so with consolidation
removed they cannot find an example and fail.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings, target
from hypothesis import strategies as st

from controlplane.fleet.placement.changes import execution_phases
from controlplane.fleet.placement.payback import payback_gain_s
from controlplane.fleet.placement.types import Gpu, ModelDemand, ModelProfile, Placement, PlannerParams, Server
from tests.fleet.planner_strategies import NOW, SETTINGS, C, H, Scenario

BIG = "big"
# Properties about moves assume there were some: about half the fleets need none (the model fits, has no
# backlog, or no move pays back), which Hypothesis' filtering health check would count against them.
FILTERED = settings(SETTINGS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
GPU_UNITS = 80


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture (pytest-django); the planner touches no storage."""
    return None


@st.composite
def fragmented_fleets(draw, backlog=False):
    """``backlog``: the large model has a large backlog and the interval's moves are not used up."""
    servers, gpus = [], []
    for s in range(draw(st.integers(1, 2))):
        servers.append(Server(f"s{s}", draw(st.sampled_from([H, H, H, C]))))
        for i in range(draw(st.integers(2, 4))):
            gpus.append(Gpu(f"s{s}", i, GPU_UNITS, draw(st.sampled_from([0, 0, 5]))))
    k = draw(st.sampled_from([1, 1, 2]))
    big = ModelProfile(BIG, draw(st.integers(35, 70)), draw(st.sampled_from([0, 5, 20])), k, 0, draw(st.integers(1, 2)))
    pending = 500_000 if backlog else draw(st.sampled_from([0, 40, 5_000, 500_000]))
    demands = [ModelDemand(BIG, pending, 100 if backlog else draw(st.sampled_from([0, 10, 100])), NOW)]
    profiles = [big]
    used, current = defaultdict(int), []
    for j in range(draw(st.integers(2, 8))):
        small = ModelProfile(f"small{j}", draw(st.integers(5, 30)), draw(st.sampled_from([0, 2, 5, 15, 40])), 1, 0, 4)
        placed = []
        for g in draw(st.lists(st.sampled_from(gpus), min_size=1, max_size=3, unique=True)):
            gid = (g.server_id, g.index)
            if used[gid] + small.memory_per_instance_bytes <= g.total_memory_bytes - g.used_by_others_bytes:
                used[gid] += small.memory_per_instance_bytes
                placed.append(Placement(small.model, g.server_id, (g.index,), 1))
        if not placed:
            continue  # a small model with no instance would be placed first and change the picture
        profiles.append(small)
        current.extend(placed)
        # Busy without a rate: the planner keeps their size, so moves are the only other changes.
        demands.append(
            ModelDemand(
                small.model,
                0,
                0,
                NOW - 10,
                1,
                loading=draw(st.sampled_from([False, False, False, True])),
                last_moved_at=draw(st.sampled_from([None, None, None, NOW - 60, NOW - 5_000])),
            )
        )
    params = PlannerParams(
        now=NOW,
        idle_ttl_s=3_600,
        interval_s=60,
        hysteresis=draw(st.sampled_from([0, 0.2, 0.5])),
        max_moves=draw(st.integers(2, 4) if backlog else st.integers(0, 4)),
        moves_done=0 if backlog else draw(st.sampled_from([0, 0, 0, 1])),
        move_cooldown_s=600,
    )
    return Scenario(tuple(demands), tuple(servers), tuple(gpus), tuple(profiles), tuple(current), params)


def _moves(out):
    """(model, from key, to key) per moved instance, read from the changes tagged move_for."""
    adds = [c for c in out.changes if c.move_for and c.after > c.before]
    return sum(c.after - c.before for c in adds)


def _moved_models(out):
    return {c.model for c in out.changes if c.move_for}


def _reach(out):
    moves = _moves(out)
    event(f"consolidation moves: {moves}")
    target(float(moves), label="moves planned")
    return moves


def _budget_s(sc):
    d, prof = sc.demand(BIG), sc.prof(BIG)
    if not d.pending_lines or not d.lines_per_second_per_instance:
        return 0.0
    gain = payback_gain_s(d.pending_lines, d.lines_per_second_per_instance, 1, sc.params.interval_s)
    return (gain - prof.load_time_s) / (1 + sc.params.hysteresis)


def _movable(sc, m):
    d = sc.demand(m)
    cooled = d.last_moved_at is None or sc.params.now - d.last_moved_at >= sc.params.move_cooldown_s
    return m != BIG and not d.loading and cooled


def _one_move_witnesses(sc):
    """Independent of the planner: per healthy GPU, the cheapest single move that would free room for one
    rank of BIG there, as {gid: [(load_time, mem, destination gid), ...]}."""
    cap, used = sc.cap(), sc.used(sc.current)
    need = sc.prof(BIG).memory_per_instance_bytes
    healthy = [gid for gid in cap if sc.state(gid[0]) is H]
    out = defaultdict(list)
    for gid in healthy:
        if cap[gid] < need:
            continue
        for p in sc.current:
            if p.server_id != gid[0] or p.gpus != (gid[1],) or not _movable(sc, p.model):
                continue
            mem = sc.prof(p.model).memory_per_instance_bytes
            if cap[gid] - used[gid] + mem < need:
                continue
            for dest in healthy:
                if dest != gid and cap[dest] - used[dest] >= mem:
                    out[gid].append((sc.prof(p.model).load_time_s, mem, dest))
    return out


def _placeable_by_consolidation(sc):
    """A witness that consolidation can place BIG: k GPUs of one healthy server, each freed by one move
    (to distinct GPUs outside the set, or one GPU with room for both), within the budget of moves and of
    payback."""
    k, left, budget = sc.prof(BIG).gpus_per_instance, sc.params.max_moves - sc.params.moves_done, _budget_s(sc)
    if left < k or budget <= 0:
        return False
    cap, used = sc.cap(), sc.used(sc.current)
    w = _one_move_witnesses(sc)
    for gset in combinations(sorted(w), k):
        if len({g[0] for g in gset}) != 1:
            continue
        options = [[o for o in w[g] if o[2] not in gset] for g in gset]
        if k == 1:
            if any(o[0] < budget for o in options[0]):
                return True
            continue
        for a in options[0]:
            for b in options[1]:
                same = a[2] == b[2]
                if a[0] + b[0] < budget and (not same or cap[a[2]] - used[a[2]] >= a[1] + b[1]):
                    return True
    return False


def _count(sc, placements, m):
    return sc.count(placements, m)


@SETTINGS
@given(st.one_of(fragmented_fleets(), fragmented_fleets(backlog=True)))
def test_every_busy_model_keeps_its_capacity_through_the_moves(sc):
    out = sc.run()
    _reach(out)
    state = defaultdict(int)
    for p in sc.current:
        state[p.key] += p.instances
    before = {prof.model: _count(sc, sc.current, prof.model) for prof in sc.profiles}
    cap = sc.cap()
    for n, phase in enumerate(execution_phases(out)):
        for c in phase:
            state[(c.model, c.server_id, c.gpus)] = c.after
            now = [Placement(*key, v) for key, v in state.items() if v]
            for prof in sc.profiles:
                if sc.demand(prof.model).busy and prof.model != BIG:
                    assert _count(sc, now, prof.model) >= before[prof.model], (prof.model, c, out)
        used = sc.used([Placement(*key, v) for key, v in state.items() if v])
        for gid, u in used.items():  # each phase ends within memory: moves land where there is room
            assert u <= cap[gid], (n, gid, u, out)


@FILTERED
@given(fragmented_fleets(backlog=True))
def test_a_model_placeable_after_consolidation_is_placed(sc):
    assume(_placeable_by_consolidation(sc))
    out = sc.run()
    _reach(out)
    assert _count(sc, out.placements, BIG) >= 1, out


@SETTINGS
@given(fragmented_fleets())
def test_no_consolidation_when_the_model_fits_already_or_has_no_backlog(sc):
    out = sc.run()
    _reach(out)
    without = sc.run(params=replace(sc.params, max_moves=0))
    d = sc.demand(BIG)
    if _count(sc, without.placements, BIG) or not (d.pending_lines and d.lines_per_second_per_instance):
        assert _moves(out) == 0 and not out.made_room_for
        assert out == without
    else:
        assert set(out.made_room_for) <= {BIG}


@FILTERED
@given(st.one_of(fragmented_fleets(), fragmented_fleets(backlog=True)))
def test_moves_stay_within_the_interval_budget_payback_and_movable_models(sc):
    out = sc.run()
    moves = _reach(out)
    assume(moves)
    assert moves <= sc.params.max_moves - sc.params.moves_done
    cost = sum(
        sc.prof(c.model).load_time_s * (c.after - c.before) for c in out.changes if c.move_for and c.after > c.before
    )
    assert cost < _budget_s(sc)  # gain(1) - L > (1 + h) * sum of the moves' load times
    for m in _moved_models(out):
        assert _movable(sc, m) and sc.prof(m).gpus_per_instance == 1
        assert _count(sc, out.placements, m) == _count(sc, sc.current, m)  # moved, never shrunk
    assert out.made_room_for == (BIG,) and _count(sc, out.placements, BIG) == 1


def _after_moves(sc, out, now):
    """The next plan's inputs as the reconciler gives them: the plan applied, its moves recorded."""
    moved = _moved_models(out)
    demands = tuple(replace(d, last_moved_at=NOW) if d.model in moved else d for d in sc.demands)
    return demands, replace(sc.params, now=now, moves_done=sc.params.moves_done + _moves(out))


@SETTINGS
@given(st.one_of(fragmented_fleets(), fragmented_fleets(backlog=True)))
def test_the_plan_is_a_fixed_point(sc):
    out = sc.run()
    _reach(out)
    demands, params = _after_moves(sc, out, NOW)
    again = sc.run(current=out.placements, demands=demands, params=params)
    assert again.placements == out.placements
    assert again.changes == ()


@FILTERED
@given(fragmented_fleets(backlog=True), st.integers(35, 70), st.sampled_from([0.0, 0.5]))
def test_no_ping_pong_a_moved_model_stays_put_through_its_cooldown(sc, need, later):
    out = sc.run()
    moves = _reach(out)
    assume(moves)
    # The next interval: the large model's work is done and another large model waits for room.
    demands, params = _after_moves(sc, out, NOW + sc.params.interval_s + later * sc.params.move_cooldown_s)
    demands = tuple(replace(d, pending_lines=0, in_flight=0) if d.model == BIG else d for d in demands)
    other = ModelProfile("big2", need, 0, 1, 0, 1)
    again = sc.run(
        current=out.placements,
        demands=(*demands, ModelDemand("big2", 500_000, 100, params.now)),
        profiles=(*sc.profiles, other),
        params=replace(params, moves_done=0, max_moves=4),
    )
    assert not (_moved_models(again) & _moved_models(out)), (out, again)
