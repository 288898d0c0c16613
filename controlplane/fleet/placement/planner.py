"""Placement planner: a pure function (demand, GPU inventory, model profiles, current placements, params)
-> target placements plus the make-before-break changes to get there.

No Django, no I/O, no clock (``params.now`` is an input), no dependence on input order: the same inputs
always give the same plan, and planning again from the plan with the same demand changes nothing.

Sizing (P pending lines, r lines/s one instance serves, T = ``interval_s``, L = ``load_time_s``,
h = ``hysteresis``, floor = max(min_instances, 1), clamp to [floor, max_instances]):

* want = clamp(ceil(P / (r * T))): instances needed to drain the backlog within one interval.
* Hysteresis: with c current instances (floor <= c <= max), keep c when |clamp(P / (r * T)) - c| <= h * c.
  Small demand wobbles then move nothing; sizes snap to ``want`` only when the error is outside the band.
* Payback: growing to n instances is worth it only if gain(n) = min(T, P / (n * r)) > L. gain(n) is how
  long each of the n instances stays busy with the current backlog within the next interval, so a new
  instance must serve longer than it spends loading. The largest such n caps the scale-up. Exempt: the
  first instance of a model with pending work and min_instances (without them work never completes or the
  operator's floor is broken), and re-placing instances off a draining server (they count as current).
  Instances on an unhealthy server are already lost, so rebuilding more than one of them must pay back.
* Busy without a usable rate (r unknown, or only in-flight work): keep the current size, at least floor.
* Idle (no pending, no in-flight): keep current instances (no growth) until ``idle_ttl_s`` has passed
  since ``last_active_at``, then shrink to min_instances.

Placement: existing placements stay where they are (moves cost a load); new instances go best-fit (the
GPU set whose free memory after placement is smallest) so whole GPUs stay free for large and gang models.
A gang model (k GPUs per instance) takes k GPUs of one healthy server. When memory is short, a busy model
may evict instances of idle models, least recently used first, never below their min_instances; models
with pending or in-flight work are never evicted. The only exception is physics: if a GPU is already
overcommitted (memory used by others grew), instances are removed there, idle LRU ones first.

Consolidation (consolidation.py has its rules): a model with a backlog that still has no instance after
growth and eviction gets room by moving other models' instances, make-before-break, when the moves pay
back (the payback rule above, extended to the moves' load times), at most ``max_moves`` per interval.

A model is placed only on servers of its pool (CatalogueModel.pool = TritonServer.pool).

Server states: healthy gets new placements; cordoned keeps (and may shrink) what it has; draining keeps a
model's placements only while that model has no capacity on healthy/cordoned servers (busy models are
re-placed elsewhere first, make-before-break; idle ones are simply not re-placed beyond min_instances);
unhealthy keeps nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace

from controlplane.fleet.placement import consolidation
from controlplane.fleet.placement.changes import diff_placements
from controlplane.fleet.placement.payback import affordable_instances, payback_gain_s
from controlplane.fleet.placement.types import (
    Gpu,
    ModelDemand,
    ModelProfile,
    Placement,
    Plan,
    PlannerParams,
    Server,
    ServerState,
)

__all__ = ["affordable_instances", "diff_placements", "payback_gain_s", "plan"]  # re-exported

Key = tuple[str, str, tuple[int, ...]]  # (model, server_id, gpus)
GpuId = tuple[str, int]
_SCHEDULED = (ServerState.HEALTHY, ServerState.CORDONED)


def plan(
    demands: Sequence[ModelDemand],
    servers: Sequence[Server],
    gpus: Sequence[Gpu],
    profiles: Sequence[ModelProfile],
    current: Sequence[Placement],
    params: PlannerParams,
) -> Plan:
    """Compute target placements. Raises ValueError on inconsistent input (duplicate ids, a demand or
    placement for a model without a profile, a GPU of an unknown server). Placements on servers or GPUs
    that left the inventory are simply dropped."""
    return _Planner(demands, servers, gpus, profiles, params).run(current)


def _index(items: Iterable, attr: str, what: str) -> dict:
    out: dict = {}
    for item in items:
        key = getattr(item, attr)
        if key in out:
            raise ValueError(f"duplicate {what} {key!r}")
        out[key] = item
    return out


class _Planner:
    """Working state of one plan() call; never outlives it, so plan() stays pure."""

    def __init__(self, demands, servers, gpus, profiles, params: PlannerParams) -> None:
        self.p = params
        self.prof: dict[str, ModelProfile] = _index(profiles, "model", "profile")
        self.dem: dict[str, ModelDemand] = _index(demands, "model", "demand")
        self.srv: dict[str, Server] = _index(servers, "server_id", "server")
        self.cap: dict[GpuId, int] = {}
        self.gpu_idx: dict[str, list[int]] = defaultdict(list)
        for g in sorted(gpus, key=lambda g: (g.server_id, g.index)):
            if g.server_id not in self.srv or (g.server_id, g.index) in self.cap:
                raise ValueError(f"GPU {g.server_id}:{g.index} is duplicated or on an unknown server")
            self.cap[(g.server_id, g.index)] = g.total_memory_bytes - g.used_by_others_bytes
            self.gpu_idx[g.server_id].append(g.index)
        if missing := sorted(set(self.dem) - set(self.prof)):
            raise ValueError(f"demand for models without a profile: {missing}")
        self.alloc: dict[Key, int] = {}
        self.used: dict[GpuId, int] = defaultdict(int)
        self.why: dict[Key, list[str]] = defaultdict(list)  # per placement key, for event rows
        self.model_why: dict[str, str] = {}
        self.notes: dict[str, str] = {}  # per model, the last word wins (grow runs again after consolidation)
        self.move_for: dict[Key, str] = {}  # keys changed by a consolidation move -> the model it made room for
        self.made_room_for: list[str] = []
        self.used_peak: dict[GpuId, int] = {}
        self.frozen: set[str] = set()  # models a consolidation of this plan already moved

    # -- bookkeeping -------------------------------------------------------------------------------
    def demand(self, m: str) -> ModelDemand:
        return self.dem.get(m) or ModelDemand(m)

    def state(self, sid: str) -> ServerState:
        return self.srv[sid].state

    def free(self, gid: GpuId) -> int:
        return self.cap[gid] - self.used[gid]

    def add(self, key: Key, n: int, why: str | None = None) -> None:
        mem = self.prof[key[0]].memory_per_instance_bytes
        for i in key[2]:
            self.used[(key[1], i)] += n * mem
        left = self.alloc.get(key, 0) + n
        if left:
            self.alloc[key] = left
        else:
            del self.alloc[key]
        if why:
            self.why[key].append(why)

    def keys(self, m: str, states: Sequence[ServerState]) -> list[Key]:
        return sorted(k for k in self.alloc if k[0] == m and self.state(k[1]) in states)

    def count(self, m: str, states: Sequence[ServerState] = _SCHEDULED) -> int:
        return sum(self.alloc[k] for k in self.keys(m, states))

    def pins_ok(self, prof: ModelProfile, sid: str, gpus: Sequence[int]) -> bool:
        if self.srv[sid].pool != prof.pool or (prof.pin_server is not None and sid != prof.pin_server):
            return False
        return not prof.pin_gpus or set(gpus) <= set(prof.pin_gpus)

    def recency(self, m: str) -> float:
        last = self.demand(m).last_active_at
        return -math.inf if last is None else last

    # -- phases --------------------------------------------------------------------------------------
    def run(self, current: Sequence[Placement]) -> Plan:
        self.absorb(current)
        models = sorted(self.prof)
        self.target_n = {m: self.desired(m) for m in models}
        for m in models:
            self.shrink_to(m, self.target_n[m])
        self.fix_overcommit()
        self.grow(models)
        if consolidation.consolidate(self, models, current):
            self.grow(models)  # what is left on the freed GPUs may now take a model that was stuck
        for m in models:
            self.settle_draining(m, self.target_n[m])
        target = tuple(Placement(*k, n) for k, n in sorted(self.alloc.items()))
        changes = []
        for c in diff_placements(current, target):
            key = (c.model, c.server_id, c.gpus)
            reason = "; ".join(self.why.get(key) or [self.model_why.get(c.model, "")])
            changes.append(replace(c, reason=reason, move_for=self.move_for.get(key, "")))
        return Plan(target, tuple(changes), tuple(self.notes.values()), tuple(self.made_room_for))

    def absorb(self, current: Sequence[Placement]) -> None:
        """Start from the current placements minus those that can no longer stand."""
        for p in sorted(current):
            prof = self.prof.get(p.model)
            if prof is None:
                raise ValueError(f"placement for model without a profile: {p.model!r}")
            if p.server_id not in self.srv or any((p.server_id, i) not in self.cap for i in p.gpus):
                self.why[p.key].append("server or GPU no longer in the inventory")
            elif self.state(p.server_id) is ServerState.UNHEALTHY:
                self.why[p.key].append("server unhealthy")
            elif len(p.gpus) != prof.gpus_per_instance:
                self.why[p.key].append(f"profile now needs {prof.gpus_per_instance} GPU(s) per instance")
            elif self.srv[p.server_id].pool != prof.pool:
                self.why[p.key].append(f"server is in pool {self.srv[p.server_id].pool!r}, the model in {prof.pool!r}")
            elif not self.pins_ok(prof, p.server_id, p.gpus):
                self.why[p.key].append("placement violates the model's pins")
            else:
                self.add(p.key, p.instances)

    def desired(self, m: str) -> int:
        prof, d, prm = self.prof[m], self.demand(m), self.p
        lo, hi = prof.min_instances, prof.max_instances
        floor = max(lo, 1)
        c_all = self.count(m, (*_SCHEDULED, ServerState.DRAINING))
        P, r, T = d.pending_lines, d.lines_per_second_per_instance, prm.interval_s
        if P > 0 and r > 0:
            raw = P / (r * T)
            head = f"{P} pending lines at {r:g} lines/s per instance need {raw:.2f} instance(s) for {T:g}s"
            if floor <= c_all <= hi and abs(min(max(raw, floor), hi) - c_all) <= prm.hysteresis * c_all:
                n, why = c_all, f"{head}; within {prm.hysteresis:.0%} of {c_all}, kept (hysteresis)"
            else:
                n = want = min(max(math.ceil(raw), floor), hi)
                why = f"{head}; sized to {want}"
                if want > c_all:
                    n = max(c_all, floor, affordable_instances(P, r, prof.load_time_s, T, want))
                    if n < want:
                        gain = payback_gain_s(P, r, n + 1, T)
                        why += f", capped at {n}: gain {gain:.1f}s <= load time {prof.load_time_s:g}s"
        elif d.busy:
            n = min(max(c_all, floor), hi)
            why = "busy without a throughput estimate; size kept"
        else:
            idle_for = math.inf if d.last_active_at is None else prm.now - d.last_active_at
            if d.last_active_at is None:
                n, why = lo, f"no work yet; held at min_instances={lo}"
            elif idle_for >= prm.idle_ttl_s:
                n, why = lo, f"idle past the {prm.idle_ttl_s:g}s TTL; scaled to min_instances={lo}"
            else:
                n = min(max(self.count(m), lo), hi)
                why = f"idle for {idle_for:g}s (< TTL {prm.idle_ttl_s:g}s); kept, not grown"
                if self.count(m) < lo:
                    why = f"idle; held at min_instances={lo}"
        self.model_why[m] = why
        return n

    def shrink_to(self, m: str, n: int) -> None:
        """Remove instances above n: cordoned servers first, then the smallest groups (frees whole groups)."""
        excess = self.count(m) - n
        order = sorted(
            self.keys(m, _SCHEDULED), key=lambda k: (self.state(k[1]) is not ServerState.CORDONED, self.alloc[k], k)
        )
        for k in order:
            if excess <= 0:
                break
            take = min(excess, self.alloc[k])
            self.add(k, -take)
            excess -= take

    def fix_overcommit(self) -> None:
        """A GPU can already be over its memory (others' usage grew): remove instances there, idle least
        recently used first. This is the only path that may remove a busy model's instance."""
        for gid in sorted(self.cap):
            victims = sorted(
                (k for k in self.alloc if k[1] == gid[0] and gid[1] in k[2]),
                key=lambda k: (self.demand(k[0]).busy, self.recency(k[0]), k),
            )
            for k in victims:
                while self.free(gid) < 0 and k in self.alloc:
                    self.add(k, -1, f"GPU {gid[0]}:{gid[1]} memory overcommitted")
                    if not self.demand(k[0]).busy:  # like an eviction: re-place idle ones only up to min
                        self.target_n[k[0]] = max(self.prof[k[0]].min_instances, self.target_n[k[0]] - 1)

    def grow(self, models: list[str]) -> None:
        """Add instances one at a time: busy models without capacity first, then models below
        min_instances, then the least-filled model, so scarce memory is shared by need."""
        stuck: set[str] = set()
        desired = self.target_n  # lowered by evictions, so an evicted idle model is not re-placed

        def priority(m: str):
            c, d = self.count(m), self.demand(m)
            tier = 0 if d.busy and c == 0 else 1 if c < self.prof[m].min_instances else 2
            return (tier, c / desired[m], -d.pending_lines, m)

        while todo := [m for m in models if m not in stuck and self.count(m) < desired[m]]:
            m = min(todo, key=priority)
            if not self.place_one(m):
                stuck.add(m)
                c = self.count(m)
                if c == 0 and not self.count(m, (ServerState.DRAINING,)):
                    self.notes[m] = (
                        f"{m}: no healthy GPU can hold an instance "
                        f"({self.prof[m].memory_per_instance_bytes} bytes on each of "
                        f"{self.prof[m].gpus_per_instance} GPU(s), pins included)"
                    )
                else:
                    self.notes[m] = f"{m}: {c} of {desired[m]} instances placed; no room for more"

    def victims(self, exclude: str) -> list[tuple[str, int]]:
        """Idle models that can give up instances, least recently used first, with how many above min."""
        out = []
        for v in sorted(self.prof, key=lambda v: (self.recency(v), v)):
            spare = self.count(v) - self.prof[v].min_instances
            if v != exclude and not self.demand(v).busy and spare > 0:
                out.append((v, spare))
        return out

    def evictions(self, sid: str, gpus: tuple[int, ...], need: int, victims):
        """Evict LRU-first on ``gpus`` until ``need`` bytes fit on each; None if impossible.
        Returns (rank of the most recent victim touched or -1, [(key, n)], free bytes left after placing)."""
        deficit = {i: need - self.free((sid, i)) for i in gpus}
        taken: dict[Key, int] = {}
        rank_used = -1
        for rank, (v, spare) in enumerate(victims):
            if all(x <= 0 for x in deficit.values()):
                break
            mem = self.prof[v].memory_per_instance_bytes
            for k in sorted(k for k in self.alloc if k[0] == v and k[1] == sid):
                while spare > 0 and taken.get(k, 0) < self.alloc[k] and any(deficit.get(i, 0) > 0 for i in k[2]):
                    taken[k] = taken.get(k, 0) + 1
                    spare -= 1
                    rank_used = rank
                    for i in k[2]:
                        if i in deficit:
                            deficit[i] -= mem
        if any(x > 0 for x in deficit.values()):
            return None
        return rank_used, sorted(taken.items()), -sum(deficit.values())

    def place_one(self, m: str) -> bool:
        """Best fit: prefer no eviction, then the fewest/least-recent evictions, then the smallest
        leftover free memory, then a GPU set the model already uses (fewer instance groups)."""
        prof = self.prof[m]
        k, need = prof.gpus_per_instance, prof.memory_per_instance_bytes
        victims = self.victims(m) if self.demand(m).busy else []
        best = None
        for sid in sorted(s for s in self.srv if self.state(s) is ServerState.HEALTHY):
            # avoid_servers: a load of this model just failed there (e.g. out of memory): try elsewhere.
            if not self.pins_ok(prof, sid, ()) or sid in prof.avoid_servers:
                continue
            per_gpu = []
            for i in self.gpu_idx.get(sid, []):
                if self.pins_ok(prof, sid, (i,)) and (ev := self.evictions(sid, (i,), need, victims)):
                    per_gpu.append((ev[0], sum(n for _, n in ev[1]), ev[2], i))
            if len(per_gpu) < k:
                continue
            chosen = tuple(sorted(i for *_, i in sorted(per_gpu)[:k]))
            ev = self.evictions(sid, chosen, need, victims)
            if ev is None:  # gang victims' min_instances shared across GPUs: this server cannot do it
                continue
            score = (ev[0], sum(n for _, n in ev[1]), ev[2], (m, sid, chosen) not in self.alloc, sid, chosen)
            if best is None or score < best[0]:
                best = (score, sid, chosen, ev[1])
        if best is None:
            return False
        _, sid, chosen, taken = best
        for key, n in taken:
            self.add(key, -n, f"evicted (idle, least recently used) to make room for {m}")
            self.target_n[key[0]] -= n  # victims only give instances above min_instances
        self.add((m, sid, chosen), 1)
        return True

    def settle_draining(self, m: str, n: int) -> None:
        """Draining placements stay only while the model has no capacity elsewhere, and never above n."""
        keys = self.keys(m, (ServerState.DRAINING,))
        has_other = self.count(m) > 0
        budget = 0 if has_other else n
        for k in sorted(keys, key=lambda k: (-self.alloc[k], k)):
            keep = min(budget, self.alloc[k])
            budget -= keep
            if keep < self.alloc[k]:
                why = "server draining; model has capacity elsewhere" if has_other else "server draining"
                self.add(k, keep - self.alloc[k], why)
