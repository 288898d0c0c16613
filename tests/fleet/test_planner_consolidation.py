"""Worked examples for consolidation (fleet/placement/consolidation.py) on a fleet of four 80 GB GPUs,
each holding busy small models with 30 GB free, and a large model that fits on none of them."""

from __future__ import annotations

import pytest

from controlplane.fleet.placement.changes import execution_phases
from controlplane.fleet.placement.types import ChangeKind, Gpu, ModelDemand, ModelProfile, Placement, Server
from tests.fleet.test_planner_scenarios import NOW, busy, run

GPUS = [Gpu("a", i, 80) for i in range(4)]


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture, which needs pytest-django; the planner touches no storage."""
    return None


def fragmented(small_gb: int, per_gpu: int, load_s: float = 5):
    """Each GPU holds per_gpu busy small models of small_gb each (their size kept: in flight, no backlog)."""
    profiles, demands, current = [], [], []
    for i in range(4):
        for j in range(per_gpu):
            name = f"s{i}{j}"
            profiles.append(ModelProfile(name, small_gb, load_s, 1, 0, 2))
            demands.append(ModelDemand(name, 0, 0, NOW, 1))
            current.append(Placement(name, "a", (i,), 1))
    return profiles, demands, current


def moves_of(out):
    return sorted((c.kind, c.model, c.gpus) for c in out.changes if c.move_for)


def test_a_50gb_model_gets_a_gpu_by_moving_one_small_model():
    profiles, demands, current = fragmented(25, 2)  # 30 GB free on each GPU
    big = ModelProfile("big", 50, 20, 1, 0, 1)
    out = run([*demands, busy("big", 50_000, 10)], [Server("a")], GPUS, [*profiles, big], current)
    assert out.made_room_for == ("big",)
    assert moves_of(out) == [(ChangeKind.LOAD, "s00", (1,)), (ChangeKind.UNLOAD, "s00", (0,))]
    assert [p for p in out.placements if p.model == "big"] == [Placement("big", "a", (0,), 1)]
    # The reconciler's order: the moved instance loads, the old one goes, then the large model loads.
    phases = [[(c.kind, c.model) for c in phase] for phase in execution_phases(out)]
    assert phases == [[(ChangeKind.LOAD, "s00")], [(ChangeKind.UNLOAD, "s00")], [(ChangeKind.LOAD, "big")]]
    assert all("make room for big" in c.reason for c in out.changes if c.move_for)


def test_without_backlog_or_when_moves_do_not_pay_back_nothing_moves():
    profiles, demands, current = fragmented(25, 2)
    big = ModelProfile("big", 50, 20, 1, 0, 1)
    for demand in (ModelDemand("big", 0, 10, NOW), busy("big", 250, 10)):  # no work / gain 25s - 20s < 5s
        out = run([*demands, demand], [Server("a")], GPUS, [*profiles, big], current)
        assert out.changes == () and out.made_room_for == ()


def test_a_2_gpu_gang_needing_60gb_on_each_takes_six_moves_when_the_interval_allows_six():
    profiles, demands, current = fragmented(10, 5, load_s=2)  # 50 GB used, 30 free on each GPU
    # Payback: gain(1) = 60 s, the gang loads in 30 s, so six moves may cost (60 - 30) / 1.2 = 25 s of loads.
    gang = ModelProfile("llm", 60, 30, 2, 0, 1)
    args = ([*demands, busy("llm", 500_000, 10)], [Server("a")], GPUS, [*profiles, gang], current)
    short = run(*args, max_moves=5)
    assert short.made_room_for == () and not moves_of(short)
    out = run(*args, max_moves=6)
    assert out.made_room_for == ("llm",)
    assert [p for p in out.placements if p.model == "llm"] == [Placement("llm", "a", (0, 1), 1)]
    assert sum(c.after - c.before for c in out.changes if c.move_for and c.after > c.before) == 6


def test_a_model_loading_or_moved_recently_is_not_moved():
    profiles, demands, current = fragmented(25, 2)
    big = ModelProfile("big", 50, 20, 1, 0, 1)
    pinned = [
        d if d.model[1] != "0" and d.model[1] != "1" else ModelDemand(d.model, 0, 0, NOW, 1, loading=True)
        for d in demands
    ]
    recent = [ModelDemand(d.model, 0, 0, NOW, 1, last_moved_at=NOW - 100) for d in demands]
    for ds in (recent,):
        out = run([*ds, busy("big", 50_000, 10)], [Server("a")], GPUS, [*profiles, big], current)
        assert out.made_room_for == ()
    out = run([*pinned, busy("big", 50_000, 10)], [Server("a")], GPUS, [*profiles, big], current)
    assert {c.model[1] for c in out.changes if c.move_for} <= {"2", "3"}
    assert out.made_room_for == ("big",)


def _small(name, gb, load_s):
    return ModelProfile(name, gb, load_s, 1, 0, 4)


def test_the_cheapest_single_move_without_a_destination_does_not_hide_a_dearer_one_that_has_one():
    # Found by the placeable-after-consolidation property: gpu1 is 8 short of 41. small1 (21, loads in 2 s)
    # covers it alone but fits nowhere (gpu0 has 19 free); small0 (19, 5 s) covers it and fits on gpu0.
    profiles = [_small("small0", 19, 5), _small("small1", 21, 2), _small("small2", 7, 0), _small("small3", 14, 0)]
    current = [Placement(m, "a", (i,), 1) for m in ("small0", "small1", "small2") for i in (0, 1)]
    current.append(Placement("small3", "a", (0,), 1))
    demands = [ModelDemand(p.model, 0, 0, NOW, 1) for p in profiles]
    big = ModelProfile("big", 41, 0, 1, 0, 1)
    gpus = [Gpu("a", i, 80) for i in range(2)]
    out = run([*demands, busy("big", 500_000, 100)], [Server("a")], gpus, [*profiles, big], current, max_moves=2)
    assert out.made_room_for == ("big",)
    assert moves_of(out) == [(ChangeKind.SCALE_UP, "small0", (0,)), (ChangeKind.UNLOAD, "small0", (1,))]


def test_a_gang_tries_the_gpu_pairs_that_clear_together_not_only_the_cheapest_two_alone():
    # Found by the same property (CI, 2026-12-02). A gang of 2 needing 66 on each GPU, 3 moves allowed. Alone,
    # gpu3 (one 0 s move) and gpu1 (three 0 s moves) are the cheapest to clear, but together they need four;
    # gpu0 + gpu3 (one 2 s move and one 0 s move) clear together and are taken.
    profiles = [_small(f"small{j}", 10, 0) for j in range(3)]
    profiles += [_small("small3", 5, 0), _small("small4", 10, 0), _small("small5", 10, 2)]
    current = [Placement(f"small{j}", "a", (1,), 1) for j in range(3)]
    current += [Placement("small3", "a", (i,), 1) for i in (0, 1, 2)]
    current += [Placement("small4", "a", (3,), 1), Placement("small5", "a", (0,), 1), Placement("small5", "a", (2,), 1)]
    demands = [
        ModelDemand(p.model, 0, 0, NOW, 1, last_moved_at=NOW - 60 if p.model == "small3" else None) for p in profiles
    ]
    gpus = [Gpu("a", i, 80, 5 if i == 3 else 0) for i in range(4)]
    gang = ModelProfile("big", 66, 0, 2, 0, 1)
    out = run(
        [*demands, busy("big", 500_000, 100)],
        [Server("a")],
        gpus,
        [*profiles, gang],
        current,
        max_moves=3,
        hysteresis=0,
    )
    assert out.made_room_for == ("big",)
    assert [p for p in out.placements if p.model == "big"] == [Placement("big", "a", (0, 3), 1)]
