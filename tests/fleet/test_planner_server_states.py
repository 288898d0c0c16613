"""Worked examples for the placement planner and the servers' states (healthy, draining, cordoned, unhealthy):
one small fleet per rule, with the exact expected plan and, where order matters, the reconciler's phases. The
helpers are test_planner_scenarios.py's."""

from __future__ import annotations

import pytest

from controlplane.fleet.placement.changes import execution_phases
from controlplane.fleet.placement.types import ChangeKind, Gpu, ModelProfile, Server, ServerState
from tests.fleet.test_planner_scenarios import P, busy, idle, kinds, run


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture, which needs pytest-django; the planner touches no storage."""
    return None


def test_draining_server_is_emptied_make_before_break():
    servers = [Server("a", ServerState.DRAINING), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("b", 0, 80)]
    profiles = [ModelProfile("emb", 10, 5, max_instances=2), ModelProfile("idle", 10, 5)]
    cur = [P("emb", "a", (0,), 2), P("idle", "a", (0,), 1)]
    out = run([busy("emb", 12_000), idle("idle", 10)], servers=servers, gpus=gpus, profiles=profiles, current=cur)
    assert kinds(out) == [
        (ChangeKind.LOAD, "emb", "b", (0,), 0, 2),
        (ChangeKind.UNLOAD, "emb", "a", (0,), 2, 0),
        (ChangeKind.UNLOAD, "idle", "a", (0,), 1, 0),  # idle: not worth re-loading elsewhere
    ]
    assert "draining" in out.changes[1].reason
    # The removals free a GPU no addition lands on: the reconciler keeps make-before-break.
    phases = [[(c.kind, c.model, c.server_id) for c in phase] for phase in execution_phases(out)]
    assert phases == [
        [(ChangeKind.LOAD, "emb", "b")],
        [(ChangeKind.UNLOAD, "emb", "a"), (ChangeKind.UNLOAD, "idle", "a")],
    ]


def test_draining_server_keeps_a_model_with_no_capacity_elsewhere():
    servers = [Server("a", ServerState.DRAINING), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("b", 0, 80, 75)]
    cur = [P("emb", "a", (0,), 2)]
    out = run(
        [busy("emb", 12_000)], servers=servers, gpus=gpus, profiles=[ModelProfile("emb", 10, 5, 1, 0, 2)], current=cur
    )
    assert out.placements == tuple(cur) and out.changes == ()


def test_cordoned_server_keeps_but_never_grows():
    servers = [Server("a", ServerState.CORDONED), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("b", 0, 80)]
    cur = [P("emb", "a", (0,), 1)]
    out = run(
        [busy("emb", 18_000)], servers=servers, gpus=gpus, profiles=[ModelProfile("emb", 10, 5, 1, 0, 4)], current=cur
    )
    assert out.placements == (P("emb", "a", (0,), 1), P("emb", "b", (0,), 2))


def test_a_shrinking_model_gives_up_its_cordoned_instances_first():
    # 3,000 lines need one instance, not three: the one on cordoned "a" goes before either on healthy "b".
    servers = [Server("a", ServerState.CORDONED), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("b", 0, 80)]
    cur = [P("emb", "a", (0,), 1), P("emb", "b", (0,), 2)]
    out = run(
        [busy("emb", 3_000)], servers=servers, gpus=gpus, profiles=[ModelProfile("emb", 10, 5, 1, 0, 4)], current=cur
    )
    assert out.placements == (P("emb", "b", (0,), 1),)


def test_unhealthy_server_loses_its_placements_and_work_moves():
    servers = [Server("a", ServerState.UNHEALTHY), Server("b")]
    gpus = [Gpu("a", 0, 80), Gpu("b", 0, 80)]
    out = run(
        [busy("emb")],
        servers=servers,
        gpus=gpus,
        profiles=[ModelProfile("emb", 10, 5)],
        current=[P("emb", "a", (0,), 1), P("emb", "gone", (0,), 1)],
    )
    assert out.placements == (P("emb", "b", (0,), 1),)
    reasons = {c.server_id: c.reason for c in out.changes if c.kind is ChangeKind.UNLOAD}
    assert reasons == {"a": "server unhealthy", "gone": "server or GPU no longer in the inventory"}
