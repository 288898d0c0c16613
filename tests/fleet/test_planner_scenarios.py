"""Worked examples for the placement planner: one small fleet per rule, with the exact expected plan.

Memory is in GiB-sized integers for readability; the planner only compares integers.
"""

from __future__ import annotations

import pytest

from controlplane.fleet.placement.changes import execution_phases
from controlplane.fleet.placement.planner import affordable_instances, diff_placements, payback_gain_s, plan
from controlplane.fleet.placement.types import (
    Change,
    ChangeKind,
    Gpu,
    ModelDemand,
    ModelProfile,
    Placement,
    PlannerParams,
    Server,
    ServerState,
)

NOW = 100_000.0
P = Placement


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture, which needs pytest-django; the planner touches no storage."""
    return None


def run(demands=(), servers=None, gpus=None, profiles=(), current=(), **params):
    servers = servers if servers is not None else [Server("a")]
    gpus = gpus if gpus is not None else [Gpu("a", 0, 80)]
    params = {"now": NOW, "idle_ttl_s": 600, "interval_s": 60, "hysteresis": 0.2, **params}
    return plan(list(demands), servers, gpus, list(profiles), list(current), PlannerParams(**params))


def busy(model, pending=6_000, rate=100.0, in_flight=0):
    return ModelDemand(model, pending, rate, NOW, in_flight)


def idle(model, ago):
    return ModelDemand(model, 0, 100.0, None if ago is None else NOW - ago, 0)


def kinds(out):
    return [(c.kind, c.model, c.server_id, c.gpus, c.before, c.after) for c in out.changes]


# -- sizing: proportional, hysteresis, payback ------------------------------------------------------------


def test_instances_proportional_to_pending_work():
    # 24 000 lines at 100 lines/s per instance over a 60 s interval need 4 instances.
    out = run([busy("emb", 24_000)], profiles=[ModelProfile("emb", 10, 5, max_instances=8)])
    assert out.placements == (P("emb", "a", (0,), 4),)
    assert "need 4.00 instance(s)" in out.changes[0].reason


def test_max_instances_caps_and_unknown_throughput_gets_one_instance():
    out = run(
        [busy("emb", 10**6), busy("x", 10**6, rate=0)],
        profiles=[ModelProfile("emb", 10, 5, max_instances=3), ModelProfile("x", 10, 5, max_instances=3)],
    )
    assert out.placements == (P("emb", "a", (0,), 3), P("x", "a", (0,), 1))


def test_hysteresis_keeps_current_size_for_small_changes():
    prof = ModelProfile("emb", 10, 5, max_instances=8)
    cur = [P("emb", "a", (0,), 2)]
    # 2.2 instances' worth of work is within 20% of 2: nothing moves.
    assert run([busy("emb", 13_200)], profiles=[prof], current=cur).changes == ()
    # 1.7 too.
    assert run([busy("emb", 10_200)], profiles=[prof], current=cur).changes == ()
    # 3.5 is outside the band: grow to ceil(3.5) = 4.
    out = run([busy("emb", 21_000)], profiles=[prof], current=cur)
    assert kinds(out) == [(ChangeKind.SCALE_UP, "emb", "a", (0,), 2, 4)]
    # 0.5 is outside the band the other way: shrink to 1 (never below one while work is pending).
    out = run([busy("emb", 3_000)], profiles=[prof], current=cur)
    assert kinds(out) == [(ChangeKind.SCALE_DOWN, "emb", "a", (0,), 2, 1)]


def test_payback_formula():
    # gain(n) = min(T, P / (n * r)): 6 000 lines at 100 lines/s on 2 instances keep each busy 30 s.
    assert payback_gain_s(6_000, 100, 2, 60) == 30
    assert payback_gain_s(60_000, 100, 2, 60) == 60  # capped by the interval
    assert affordable_instances(6_000, 100, 20, 60, cap=8) == 2  # n=3 gives 20 s, not > 20 s
    assert affordable_instances(6_000, 100, 90, 60, cap=8) == 0  # load slower than the interval


def test_scale_up_only_when_it_pays_back_the_load_time():
    cur = [P("llm", "a", (0,), 1)]
    # 24 000 lines / (100 lines/s * 60 s) = 4 instances, each busy min(60, 24 000 / 400) = 60 s.
    fast = ModelProfile("llm", 10, 30, max_instances=8)
    assert run([busy("llm", 24_000)], profiles=[fast], current=cur).placements == (P("llm", "a", (0,), 4),)
    # A load slower than the interval never pays back within it: keep the one instance.
    slow = ModelProfile("llm", 10, 75, max_instances=8)
    assert run([busy("llm", 24_000)], profiles=[slow], current=cur).changes == ()
    # 13 200 lines = 2.2 instances' worth -> want 3, but 3 instances are busy only 44 s each (< 50 s load);
    # 2 instances are busy the full 60 s, so the scale-up stops at 2.
    mid = ModelProfile("llm", 10, 50, max_instances=8)
    out = run([busy("llm", 13_200)], profiles=[mid], current=cur)
    assert out.placements == (P("llm", "a", (0,), 2),)
    assert "capped at 2: gain 44.0s <= load time 50s" in out.changes[0].reason


def test_first_instance_is_loaded_even_if_it_cannot_pay_back():
    out = run([busy("llm", 10)], profiles=[ModelProfile("llm", 10, 600)])
    assert out.placements == (P("llm", "a", (0,), 1),)


# -- idle models -------------------------------------------------------------------------------------


def test_idle_model_scales_to_zero_after_ttl_but_keeps_min_instances():
    profiles = [
        ModelProfile("old", 10, 5, max_instances=2),
        ModelProfile("floor", 10, 5, min_instances=1, max_instances=2),
    ]
    cur = [P("old", "a", (0,), 2), P("floor", "a", (0,), 2)]
    out = run([idle("old", 601), idle("floor", 601)], profiles=profiles, current=cur)
    assert out.placements == (P("floor", "a", (0,), 1),)
    assert all("TTL" in c.reason for c in out.changes)
    # Within the TTL nothing changes, and a model that never had work is idle forever.
    assert run([idle("old", 599), idle("floor", 599)], profiles=profiles, current=cur).changes == ()
    assert run([], profiles=profiles, current=cur).placements == (P("floor", "a", (0,), 1),)


def test_min_instances_loaded_without_demand():
    out = run([], profiles=[ModelProfile("warm", 10, 5, min_instances=2, max_instances=2)])
    assert out.placements == (P("warm", "a", (0,), 2),)


def test_in_flight_work_keeps_the_model_even_without_pending_lines():
    cur = [P("emb", "a", (0,), 2)]
    out = run(
        [ModelDemand("emb", 0, 100, NOW - 10_000, in_flight=3)],
        profiles=[ModelProfile("emb", 10, 5, max_instances=4)],
        current=cur,
    )
    assert out.changes == ()


# -- memory pressure: eviction -----------------------------------------------------------------------


def test_least_recently_used_idle_model_is_evicted_first():
    gpus = [Gpu("a", 0, 24)]
    profiles = [
        ModelProfile("older", 8, 5),
        ModelProfile("newer", 8, 5),
        ModelProfile("keep", 8, 5),
        ModelProfile("hot", 8, 5),
    ]
    cur = [P("older", "a", (0,), 1), P("newer", "a", (0,), 1), P("keep", "a", (0,), 1)]
    demands = [idle("older", 300), idle("newer", 100), busy("keep", in_flight=1), busy("hot")]
    out = run(demands, gpus=gpus, profiles=profiles, current=cur)
    assert out.placements == (P("hot", "a", (0,), 1), P("keep", "a", (0,), 1), P("newer", "a", (0,), 1))
    assert kinds(out)[0][0] is ChangeKind.LOAD  # make-before-break: the load is listed first
    (unload,) = [c for c in out.changes if c.kind is ChangeKind.UNLOAD]
    assert unload.model == "older" and "evicted" in unload.reason and "hot" in unload.reason
    # ... but the reconciler unloads it first: the load needs its memory (24 GB: 32 with both, for seconds).
    phases = [[(c.kind, c.model) for c in phase] for phase in execution_phases(out)]
    assert phases == [[(ChangeKind.UNLOAD, "older")], [(ChangeKind.LOAD, "hot")]]


def test_busy_models_are_never_evicted():
    gpus = [Gpu("a", 0, 16)]
    profiles = [ModelProfile("busy", 10, 5), ModelProfile("queued", 10, 5), ModelProfile("idle", 4, 5, min_instances=1)]
    cur = [P("busy", "a", (0,), 1), P("idle", "a", (0,), 1)]
    demands = [busy("busy", pending=0, in_flight=1), busy("queued"), idle("idle", 10)]
    out = run(demands, gpus=gpus, profiles=profiles, current=cur)
    assert out.changes == ()  # the idle model is at its min_instances, the busy one is untouchable
    assert out.notes == ("queued: no healthy GPU can hold an instance (10 bytes on each of 1 GPU(s), pins included)",)


def test_overcommitted_gpu_sheds_idle_instances_first():
    gpus = [Gpu("a", 0, 40, used_by_others_bytes=25)]  # someone else grew to 25 of 40
    profiles = [ModelProfile("busy", 10, 5), ModelProfile("idle", 10, 5)]
    cur = [P("busy", "a", (0,), 1), P("idle", "a", (0,), 1)]
    out = run([busy("busy"), idle("idle", 10)], gpus=gpus, profiles=profiles, current=cur)
    assert out.placements == (P("busy", "a", (0,), 1),)
    assert "overcommitted" in out.changes[0].reason


def test_a_busy_instance_shed_by_overcommit_is_placed_again_where_there_is_room():
    # Only overcommit may take a busy model's instance; it keeps its target, so growth re-places it on GPU 1
    # (an idle one would be lowered towards min_instances, like an eviction).
    gpus = [Gpu("a", 0, 40, used_by_others_bytes=35), Gpu("a", 1, 40)]
    out = run([busy("hot")], gpus=gpus, profiles=[ModelProfile("hot", 10, 5)], current=[P("hot", "a", (0,), 1)])
    assert out.placements == (P("hot", "a", (1,), 1),)
    assert [c.kind for c in out.changes] == [ChangeKind.LOAD, ChangeKind.UNLOAD]


def test_an_eviction_takes_only_instances_on_the_gpus_it_makes_room_on():
    # GPU 1 cannot hold "new" even without the idle "older" (busy "busy" keeps 25 of 40); GPU 0 can once the
    # idle "newer" goes. "older", the least recently used, sits on GPU 1 only: evicting it frees nothing on
    # GPU 0, so it stays.
    gpus = [Gpu("a", 0, 40), Gpu("a", 1, 40)]
    profiles = [ModelProfile("older", 10, 5), ModelProfile("newer", 30, 5), ModelProfile("busy", 25, 5)]
    profiles.append(ModelProfile("new", 20, 5))
    cur = [P("older", "a", (1,), 1), P("busy", "a", (1,), 1), P("newer", "a", (0,), 1)]
    demands = [idle("older", 300), idle("newer", 100), busy("busy", pending=0, in_flight=1), busy("new")]
    out = run(demands, gpus=gpus, profiles=profiles, current=cur)
    assert out.placements == (P("busy", "a", (1,), 1), P("new", "a", (0,), 1), P("older", "a", (1,), 1))
    assert [(c.kind, c.model) for c in out.changes if c.kind is ChangeKind.UNLOAD] == [(ChangeKind.UNLOAD, "newer")]


def test_overcommit_does_not_move_an_idle_model_into_memory_a_busy_model_then_takes():
    # Regression (found by test_idempotent): 2 x 24 on a 29-unit GPU loses one instance to physics. Re-placing
    # that idle instance on GPU 0 would make it evictable next round, so the plan would not be a fixed point.
    gpus = [Gpu("a", 0, 24), Gpu("a", 1, 40, used_by_others_bytes=11)]
    profiles = [ModelProfile("idle", 24, 0, min_instances=1, max_instances=2), ModelProfile("hot", 6, 0, pin_gpus=(1,))]
    demands = [idle("idle", 0), ModelDemand("hot", 1, 0, None)]
    out = run(demands, gpus=gpus, profiles=profiles, current=[P("idle", "a", (1,), 2)], hysteresis=0)
    assert out.placements == (P("idle", "a", (1,), 1),)
    assert run(demands, gpus=gpus, profiles=profiles, current=out.placements, hysteresis=0).changes == ()


# -- packing ------------------------------------------------------------------------------------------


def test_best_fit_keeps_a_whole_gpu_free_for_a_large_model():
    gpus = [Gpu("a", 0, 80), Gpu("a", 1, 80, used_by_others_bytes=60)]
    profiles = [ModelProfile("small", 10, 5), ModelProfile("big", 70, 5)]
    out = run([busy("small", 100_000)], gpus=gpus, profiles=profiles)
    assert out.placements == (P("small", "a", (1,), 1),)  # the nearly full GPU, not the empty one
    out = run([busy("small", 100_000), busy("big", 10)], gpus=gpus, profiles=profiles, current=out.placements)
    assert out.placements == (P("big", "a", (0,), 1), P("small", "a", (1,), 1))


def test_gang_model_takes_k_gpus_of_one_server():
    servers = [Server("a"), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("a", 1, 80, 75), Gpu("b", 0, 80), Gpu("b", 1, 80), Gpu("b", 2, 80, 30)]
    prof = ModelProfile("llm70b", 40, 120, gpus_per_instance=2)
    out = run([busy("llm70b")], servers=servers, gpus=gpus, profiles=[prof])
    # Server a has two GPUs but one is nearly full; on b the best fit pairs the fuller GPU 2 with GPU 0.
    assert out.placements == (P("llm70b", "b", (0, 2), 1),)


def test_gang_is_never_split_across_servers():
    servers = [Server("a"), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("b", 0, 80)]
    out = run([busy("llm")], servers=servers, gpus=gpus, profiles=[ModelProfile("llm", 40, 60, 2)])
    assert out.placements == ()
    assert out.notes and "2 GPU(s)" in out.notes[0]


def test_changed_gpus_per_instance_replaces_the_old_placement():
    gpus = [Gpu("a", 0, 80), Gpu("a", 1, 80)]
    out = run([busy("llm")], gpus=gpus, profiles=[ModelProfile("llm", 40, 60, 2)], current=[P("llm", "a", (0,), 1)])
    assert kinds(out) == [(ChangeKind.LOAD, "llm", "a", (0, 1), 0, 1), (ChangeKind.UNLOAD, "llm", "a", (0,), 1, 0)]


def test_pins_are_honoured():
    servers = [Server("a"), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("a", 1, 80), Gpu("b", 0, 80, 70)]
    profiles = [
        ModelProfile("on_b", 5, 5, pin_server="b"),
        ModelProfile("gpu1", 5, 5, pin_gpus=(1,)),
        ModelProfile("too_big_for_b", 20, 5, pin_server="b"),
    ]
    out = run([busy("on_b"), busy("gpu1"), busy("too_big_for_b")], servers=servers, gpus=gpus, profiles=profiles)
    # gpu1 would best-fit onto b:0 (fullest) but is pinned to index 1, which only server a has.
    assert out.placements == (P("gpu1", "a", (1,), 1), P("on_b", "b", (0,), 1))
    assert any(n.startswith("too_big_for_b:") for n in out.notes)


def test_a_model_goes_only_to_servers_of_its_pool():
    servers = [Server("big", pool="h100"), Server("small", pool="t4")]
    gpus = [Gpu("big", 0, 80, 70), Gpu("small", 0, 80)]  # best fit alone would pick the fuller "big"
    profiles = [ModelProfile("emb", 5, 5, pool="t4"), ModelProfile("llm", 20, 5, pool="h100")]
    out = run([busy("emb"), busy("llm")], servers=servers, gpus=gpus, profiles=profiles)
    assert out.placements == (P("emb", "small", (0,), 1),)
    assert any(n.startswith("llm:") for n in out.notes), "no h100 server can hold it: queued, not put on a t4"
    # The model's pool changed (an operator edited it): its placement elsewhere is replaced by one in the pool.
    moved = run([busy("emb")], servers=servers, gpus=gpus, profiles=[ModelProfile("emb", 5, 5, pool="h100")],
                current=[P("emb", "small", (0,), 1)])  # fmt: skip
    assert moved.placements == (P("emb", "big", (0,), 1),)
    assert any("pool 't4', the model in 'h100'" in c.reason for c in moved.changes)


# -- the plan as a whole ---------------------------------------------------------------------------------


def test_replanning_the_output_changes_nothing_and_order_does_not_matter():
    servers = [Server("b"), Server("a")]
    gpus = [Gpu("b", 0, 40), Gpu("a", 1, 80), Gpu("a", 0, 80, 30)]
    profiles = [ModelProfile("x", 12, 5, 1, 0, 4), ModelProfile("y", 30, 5, 2, 0, 2), ModelProfile("z", 8, 5)]
    demands = [busy("x", 30_000), busy("y", 500), idle("z", 5)]
    first = run(demands, servers, gpus, profiles, [P("z", "b", (0,), 1)])
    again = run(demands[::-1], servers[::-1], gpus[::-1], profiles[::-1], [P("z", "b", (0,), 1)])
    assert first == again
    assert run(demands, servers, gpus, profiles, first.placements).changes == ()


def test_diff_placements_orders_additions_before_removals():
    cur = [P("m", "a", (0,), 2), P("m", "b", (0,), 1), P("n", "a", (1,), 1), P("n", "a", (1,), 1)]
    tgt = [P("m", "a", (0,), 1), P("m", "c", (0,), 1), P("n", "a", (1,), 3)]
    assert diff_placements(cur, tgt) == [
        Change(ChangeKind.LOAD, "m", "c", (0,), 0, 1),
        Change(ChangeKind.SCALE_UP, "n", "a", (1,), 2, 3),
        Change(ChangeKind.SCALE_DOWN, "m", "a", (0,), 2, 1),
        Change(ChangeKind.UNLOAD, "m", "b", (0,), 1, 0),
    ]


@pytest.mark.parametrize(
    "build",
    [
        lambda: run([busy("ghost")]),  # demand for a model without a profile
        lambda: run(current=[P("ghost", "a", (0,), 1)]),
        lambda: run(gpus=[Gpu("a", 0, 8), Gpu("a", 0, 8)]),
        lambda: run(gpus=[Gpu("nowhere", 0, 8)]),
        lambda: run(profiles=[ModelProfile("m", 1, 1), ModelProfile("m", 1, 1)]),
        lambda: ModelProfile("m", 1, 1, min_instances=3, max_instances=2),
        lambda: ModelProfile("m", 1, 1, gpus_per_instance=2, pin_gpus=(0,)),
        lambda: Placement("m", "a", (0, 0), 1),
        lambda: PlannerParams(now=0, hysteresis=1.0),
    ],
)
def test_inconsistent_input_is_rejected(build):
    with pytest.raises(ValueError):
        build()


def test_a_server_where_the_load_failed_is_avoided_and_the_model_goes_elsewhere():
    servers, gpus = [Server("a"), Server("b")], [Gpu("a", 0, 80), Gpu("b", 0, 80)]
    profile = ModelProfile("m", 10, 1.0, max_instances=1)
    assert [p.server_id for p in run([busy("m")], servers, gpus, [profile]).placements] == ["a"]
    avoided = ModelProfile("m", 10, 1.0, max_instances=1, avoid_servers=("a",))
    assert [p.server_id for p in run([busy("m")], servers, gpus, [avoided]).placements] == ["b"]
    # With nowhere else to go the model waits rather than retrying the failing server at once.
    assert run([busy("m")], [Server("a")], [Gpu("a", 0, 80)], [avoided]).placements == ()
