"""Hypothesis strategies and helpers for the planner property tests (see test_planner_properties.py)."""

from __future__ import annotations

import math
import os
from collections import defaultdict
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
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
    ServerState,
)

NOW = 10_000.0
# PLANNER_EXAMPLES=5000 for a deep run; the default keeps tests/fleet well under a minute on 2 cores.
SETTINGS = settings(
    max_examples=int(os.environ.get("PLANNER_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
H, C, D, U = ServerState.HEALTHY, ServerState.CORDONED, ServerState.DRAINING, ServerState.UNHEALTHY


@dataclass(frozen=True)
class Scenario:
    demands: tuple[ModelDemand, ...]
    servers: tuple[Server, ...]
    gpus: tuple[Gpu, ...]
    profiles: tuple[ModelProfile, ...]
    current: tuple[Placement, ...]
    params: PlannerParams

    def run(self, current=None, **overrides):
        args = dict(
            demands=self.demands,
            servers=self.servers,
            gpus=self.gpus,
            profiles=self.profiles,
            current=self.current if current is None else current,
            params=self.params,
        )
        args.update(overrides)
        return plan(**args)

    # -- independent views used by the properties -------------------------------------------------
    def prof(self, m):
        return next(p for p in self.profiles if p.model == m)

    def demand(self, m):
        return next((d for d in self.demands if d.model == m), ModelDemand(m))

    def state(self, sid):
        return next(s.state for s in self.servers if s.server_id == sid)

    def pool(self, sid):
        return next(s.pool for s in self.servers if s.server_id == sid)

    def cap(self):
        return {(g.server_id, g.index): g.total_memory_bytes - g.used_by_others_bytes for g in self.gpus}

    def used(self, placements):
        out = defaultdict(int)
        for p in placements:
            for i in p.gpus:
                out[(p.server_id, i)] += p.instances * self.prof(p.model).memory_per_instance_bytes
        return out

    def count(self, placements, m, states=(H, C)):
        return sum(p.instances for p in placements if p.model == m and self.state(p.server_id) in states)


# Strategies are built once at import: constructing them inside the composite costs more than planning.
_N_SERVERS, _N_GPUS, _K, _LO = st.integers(1, 3), st.integers(1, 4), st.sampled_from([1, 1, 1, 2]), st.integers(0, 1)
_PIN_GPUS = {
    1: st.sampled_from([()] * 6 + [(0, 1), (1, 2, 3), (0,), (1,)]),
    2: st.sampled_from([()] * 6 + [(0, 1), (1, 2, 3)]),
}
_PIN_SERVER = st.sampled_from([None] * 5 + ["s0"])
_POOL = st.sampled_from(["default"] * 4 + ["x"])
_LOAD, _HI, _N_MODELS = st.sampled_from([0, 5, 30, 120]), st.integers(1, 4), st.integers(1, 5)
_PENDING, _RATE = st.sampled_from([0, 0, 1, 100, 3_000, 50_000]), st.sampled_from([0, 5, 50, 500])
_DEMAND_ROW = st.sampled_from([True, True, False])  # no row: implicitly idle
_LAST = st.sampled_from([None, 0, 10, 100, 250, 400, 1_000, 5_000]).map(lambda ago: None if ago is None else NOW - ago)
_IN_FLIGHT = st.sampled_from([0, 0, 1])
_INTERVAL, _HYST = st.sampled_from([30, 60, 300]), st.sampled_from([0, 0.1, 0.25, 0.5])
_TOTALS = (8, 16, 24, 40, 80)


@dataclass(frozen=True)
class _Knobs:
    state: st.SearchStrategy
    total: st.SearchStrategy
    used: dict
    mem: st.SearchStrategy
    ttl: st.SearchStrategy
    attempts: st.SearchStrategy
    pending: st.SearchStrategy = _PENDING
    last: st.SearchStrategy = _LAST
    demand_row: st.SearchStrategy = _DEMAND_ROW


def _attempts(lo, hi):
    count = st.sampled_from([1, 1, 2, 3])
    return st.lists(st.tuples(st.integers(0, 4), st.integers(0, 2), st.integers(0, 3), count), min_size=lo, max_size=hi)


_GENERAL = _Knobs(
    st.sampled_from([H, H, H, H, C, D, D, U]),
    st.sampled_from(_TOTALS),
    {t: st.integers(0, t // 2) for t in _TOTALS},
    st.integers(1, 30),
    st.sampled_from([0, 300, 600, 3_600]),
    _attempts(0, 8),
)
_MESSY = replace(_GENERAL, used={t: st.integers(0, t + 8) for t in _TOTALS})
# Small, full GPUs and long TTLs, so busy models must evict idle ones.
_PRESSURE = _Knobs(
    st.sampled_from([H, H, H, C]),
    st.sampled_from([8, 16]),
    {8: st.just(0), 16: st.just(0)},
    st.integers(3, 10),
    st.just(3_600),
    _attempts(4, 14),
    st.sampled_from([0, 0, 0, 100, 50_000]),
    st.sampled_from([NOW - 1_000, NOW - 500, NOW - 10]),
    st.just(True),
)


@st.composite
def scenarios(draw, messy=False, pressure=False):
    kn = _PRESSURE if pressure else _MESSY if messy else _GENERAL
    servers = tuple(Server(f"s{i}", draw(kn.state), draw(_POOL)) for i in range(draw(_N_SERVERS)))
    gpus = []
    for s in servers:
        for i in range(draw(_N_GPUS)):
            total = draw(kn.total)
            gpus.append(Gpu(s.server_id, i, total, draw(kn.used[total])))
    profiles, demands = [], []
    for j in range(draw(_N_MODELS)):
        k, lo = draw(_K), draw(_LO)
        profiles.append(
            ModelProfile(
                f"m{j}",
                draw(kn.mem),
                draw(_LOAD),
                k,
                lo,
                draw(_HI),
                draw(_PIN_SERVER),
                draw(_PIN_GPUS[k]),
                pool=draw(_POOL),
            )
        )
        if draw(kn.demand_row):
            demands.append(ModelDemand(f"m{j}", draw(kn.pending), draw(_RATE), draw(kn.last), draw(_IN_FLIGHT)))
    params = PlannerParams(now=NOW, idle_ttl_s=draw(kn.ttl), interval_s=draw(_INTERVAL), hysteresis=draw(_HYST))
    sc = Scenario(tuple(demands), servers, tuple(gpus), tuple(profiles), (), params)
    # Current placements: random attempts, kept only when valid unless ``messy``.
    by_server = defaultdict(list)
    for g in gpus:
        by_server[g.server_id].append(g.index)
    current, cap = {}, sc.cap()
    for mi, si, start, n in draw(kn.attempts):
        prof, server = profiles[mi % len(profiles)], servers[si % len(servers)]
        sid = server.server_id
        idx = by_server[sid]
        if len(idx) < prof.gpus_per_instance:
            continue
        chosen = tuple(sorted(idx[(start + t) % len(idx)] for t in range(prof.gpus_per_instance)))
        pins_ok = (
            prof.pin_server in (None, sid)
            and (not prof.pin_gpus or set(chosen) <= set(prof.pin_gpus))
            and server.pool == prof.pool
        )
        total = sum(v for (m, _, _), v in current.items() if m == prof.model)
        trial = Placement(prof.model, sid, chosen, n)
        used = sc.used([Placement(*k, v) for k, v in current.items()] + [trial])
        fits = all(used[(sid, i)] <= cap[(sid, i)] for i in chosen)
        if messy or (pins_ok and fits and total + n <= prof.max_instances):
            current[trial.key] = current.get(trial.key, 0) + n
    return Scenario(
        sc.demands, servers, sc.gpus, sc.profiles, tuple(Placement(*k, v) for k, v in current.items()), params
    )


@st.composite
def eviction_scenarios(draw):
    """One healthy server whose GPUs are full of idle models of distinct ages; a busy model arrives."""
    n_gpus, n_idle = draw(st.integers(1, 2)), draw(st.integers(2, 5))
    gpus = tuple(Gpu("s0", i, 16) for i in range(n_gpus))
    profiles = [ModelProfile(f"idle{j}", draw(st.integers(2, 8)), 5, 1, draw(_LO), 3) for j in range(n_idle)]
    ages = draw(st.permutations(range(n_idle)))
    demands = [ModelDemand(p.model, 0, 10, NOW - 10 * (1 + age)) for p, age in zip(profiles, ages, strict=True)]
    current, used = [], defaultdict(int)
    for j, i, n in draw(
        st.lists(
            st.tuples(st.integers(0, n_idle - 1), st.integers(0, n_gpus - 1), st.integers(1, 2)), min_size=2, max_size=8
        )
    ):
        prof = profiles[j]
        if (
            used[i] + n * prof.memory_per_instance_bytes <= 16
            and sum(p.instances for p in current if p.model == prof.model) + n <= prof.max_instances
        ):
            used[i] += n * prof.memory_per_instance_bytes
            current.append(Placement(prof.model, "s0", (i,), n))
    k = draw(st.integers(1, n_gpus))
    profiles.append(ModelProfile("hot", draw(st.integers(2, 16)), 5, k, 0, 2))
    demands.append(ModelDemand("hot", draw(st.sampled_from([1, 50_000])), 10, NOW, draw(st.integers(0, 1))))
    merged = _totals(current)
    return Scenario(
        tuple(demands),
        (Server("s0"),),
        gpus,
        tuple(profiles),
        tuple(Placement(*key, v) for key, v in merged.items()),
        PlannerParams(now=NOW, idle_ttl_s=3_600),
    )


def _totals(placements):
    out = defaultdict(int)
    for p in placements:
        out[p.key] += p.instances
    return out


# Most properties run on a mix: general fleets, plus small full GPUs where evictions actually happen.
CLEAN = st.one_of(scenarios(), scenarios(pressure=True), eviction_scenarios())
MESSY = st.one_of(scenarios(messy=True), scenarios(pressure=True))


def want(sc, m):
    prof, d = sc.prof(m), sc.demand(m)
    floor = max(prof.min_instances, 1)
    raw = d.pending_lines / (d.lines_per_second_per_instance * sc.params.interval_s)
    return raw, min(max(math.ceil(raw), floor), prof.max_instances)
