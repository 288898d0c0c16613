"""Property tests for tensor-parallel generation models in the placement planner (gang placement).

A model served with tensor_parallel_size k is one instance over k GPUs of one server (the planner's
gpus_per_instance), and its memory per GPU includes the KV budget its engine preallocates (vLLM holds
gpu_memory_utilization x the GPU on each of its GPUs: build_engines/generation_memory.py). Fleets here are
what such models meet: servers of 1-8 large GPUs, partly filled with small single-GPU models, some idle.
Memory is in GiB-like integer units.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.fleet.placement.planner import plan
from controlplane.fleet.placement.types import Gpu, ModelDemand, ModelProfile, Placement, PlannerParams, Server
from tests.fleet.planner_strategies import NOW, SETTINGS, C, H, Scenario

LLM = "llm-tp"


@pytest.fixture
def storage_dir():
    """Shadows the suite-wide autouse fixture (pytest-django); the planner touches no storage."""
    return None


@st.composite
def gang_fleets(draw):
    """Servers of 1-8 GPUs (80 or 141 units, some memory held by others), small single-GPU models placed
    where they fit, and one tensor-parallel model (k in 2, 4, 8) whose per-GPU memory is util x 80."""
    servers, gpus = [], []
    for s in range(draw(st.integers(1, 3))):
        sid = f"s{s}"
        servers.append(Server(sid, draw(st.sampled_from([H, H, H, C]))))
        size = draw(st.sampled_from([80, 141]))
        for i in range(draw(st.integers(1, 8))):
            gpus.append(Gpu(sid, i, size, draw(st.sampled_from([0, 0, 2, 10]))))
    k = draw(st.sampled_from([2, 4, 8]))
    need = int(draw(st.sampled_from([0.3, 0.5, 0.9])) * 80)
    llm = ModelProfile(LLM, need, draw(st.sampled_from([0, 30, 120])), k, 0, draw(st.integers(1, 3)))
    pending = draw(st.sampled_from([0, 5_000, 500_000]))
    demands = [ModelDemand(LLM, pending, draw(st.sampled_from([0, 20, 200])), NOW, draw(st.sampled_from([0, 0, 1])))]
    profiles = [llm]
    sc = Scenario((), tuple(servers), tuple(gpus), (), (), PlannerParams(now=NOW, idle_ttl_s=3_600))
    cap, used, current = sc.cap(), defaultdict(int), []
    for j in range(draw(st.integers(0, 5))):
        small = ModelProfile(f"small{j}", draw(st.integers(4, 40)), 5, 1, draw(st.integers(0, 1)), 4)
        profiles.append(small)
        busy = draw(st.booleans())
        demands.append(ModelDemand(small.model, 100 if busy else 0, 50, NOW - draw(st.sampled_from([10, 500])), 0))
        for gid in draw(st.lists(st.sampled_from(sorted(cap)), max_size=3, unique=True)):
            if used[gid] + small.memory_per_instance_bytes <= cap[gid]:
                used[gid] += small.memory_per_instance_bytes
                current.append(Placement(small.model, gid[0], (gid[1],), 1))
    return Scenario(tuple(demands), tuple(servers), tuple(gpus), tuple(profiles), tuple(current), sc.params)


def _room(sc, placements, sid):
    """GPUs of server sid with room for one more gang rank, counting idle evictable models' memory as free."""
    cap, used = sc.cap(), sc.used(placements)
    evictable = defaultdict(int)
    for p in placements:
        prof = sc.prof(p.model)
        if p.model != LLM and not sc.demand(p.model).busy and prof.min_instances == 0:
            for i in p.gpus:
                evictable[(p.server_id, i)] += p.instances * prof.memory_per_instance_bytes
    need = sc.prof(LLM).memory_per_instance_bytes
    return [gid for gid in cap if gid[0] == sid and cap[gid] - used[gid] + evictable[gid] >= need]


@SETTINGS
@given(gang_fleets())
def test_a_gang_spans_k_distinct_gpus_of_its_own_server(sc):
    out = sc.run()
    k = sc.prof(LLM).gpus_per_instance
    inventory = {(g.server_id, g.index) for g in sc.gpus}
    for p in out.placements:
        if p.model == LLM:
            assert len(p.gpus) == len(set(p.gpus)) == k, p
            # Every rank on a GPU of the placement's own server: one instance never spans servers.
            assert all((p.server_id, i) in inventory for i in p.gpus), (p, sorted(inventory))


@SETTINGS
@given(gang_fleets())
def test_no_gpu_holds_more_than_its_memory(sc):
    out = sc.run()
    cap, used = sc.cap(), sc.used(out.placements)
    for gid, held in used.items():
        assert held <= cap[gid], (gid, held, cap[gid], out.placements)


@SETTINGS
@given(gang_fleets())
def test_each_rank_of_a_new_gang_had_room_on_its_gpu(sc):
    """Placing a gang never relies on memory another busy model holds: every GPU of a new gang instance
    held, before it, at most its capacity minus the gang's per-GPU memory (after evictions of idle models)."""
    out = sc.run()
    need = sc.prof(LLM).memory_per_instance_bytes
    cap = sc.cap()
    others = sc.used([p for p in out.placements if p.model != LLM])
    before = {p.key: p.instances for p in sc.current}
    for p in out.placements:
        if p.model == LLM and p.instances > before.get(p.key, 0):
            for i in p.gpus:
                llm_here = sum(
                    q.instances for q in out.placements if q.model == LLM and q.server_id == p.server_id and i in q.gpus
                )
                assert others[(p.server_id, i)] + llm_here * need <= cap[(p.server_id, i)]


@SETTINGS
@given(gang_fleets())
def test_a_busy_gang_model_is_placed_when_one_server_has_k_gpus_with_room(sc):
    out = sc.run()
    if not sc.demand(LLM).busy or sc.count(out.placements, LLM):
        return
    k = sc.prof(LLM).gpus_per_instance
    for s in sc.servers:
        if s.state is H:
            assert len(_room(sc, out.placements, s.server_id)) < k, (s.server_id, out)
    assert any(note.startswith(f"{LLM}: no healthy GPU can hold an instance") for note in out.notes), out.notes


@SETTINGS
@given(st.sampled_from([2, 4, 8]), st.integers(1, 4), st.integers(1, 40), st.integers(0, 1))
def test_free_memory_spread_over_servers_never_makes_a_gang(k, n_servers, need, short_by):
    """Each server has k - 1 empty GPUs (or k GPUs with one short of room): in total there is room for
    several instances, on no single server for one. The gang is not placed, and the plan says why."""
    gpus = [Gpu(f"s{s}", i, need) for s in range(n_servers) for i in range(k - 1)]
    if short_by:  # one more server with k GPUs, one of which is short of the per-GPU memory
        gpus += [Gpu("short", i, need - 1 if i == 0 else need) for i in range(k)]
    servers = [Server(sid) for sid in sorted({g.server_id for g in gpus})]
    out = plan(
        [ModelDemand(LLM, 10_000, 10, NOW)],
        servers,
        gpus,
        [ModelProfile(LLM, need, 0, k)],
        [],
        PlannerParams(now=NOW),
    )
    assert sum(g.total_memory_bytes for g in gpus) >= need * k or n_servers * (k - 1) < k
    assert out.placements == ()
    assert out.notes == (
        f"{LLM}: no healthy GPU can hold an instance ({need} bytes on each of {k} GPU(s), pins included)",
    )
    # One GPU more on any server, and it fits there.
    grown = [*gpus, Gpu("s0", k - 1, need)]
    out = plan(
        [ModelDemand(LLM, 10_000, 10, NOW)], servers, grown, [ModelProfile(LLM, need, 0, k)], [], PlannerParams(now=NOW)
    )
    assert [(p.server_id, p.gpus) for p in out.placements] == [("s0", tuple(range(k)))]
