"""Consolidation for the placement planner: make room for a model that fits on no GPU (or no k GPUs of one
server) by moving other models' instances, make-before-break. Pure, like planner.py, which calls it after
its grow phase with its own working state.

Rules (planner.py's docstring has the sizing ones this extends):

* Only for a model with a backlog (pending lines and a known rate) and no instance on a healthy or
  cordoned server after growth and eviction had their turn. A model that could already be placed never
  triggers it.
* A move takes one instance of a single-GPU model off one of the GPUs the waiting model will use and puts
  it on another GPU of a healthy server (pool, pins and avoid_servers honoured) that has room for it both
  in the target and at the plan's peak (everything loaded now plus every addition, before any removal),
  so the new instance loads beside what is still there and the old one goes only after it is ready: the moved model never drops below its current capacity.
  Gang (multi-GPU) instances are never moved.
* Never moved: the waiting model itself, a model whose instances are all still loading (it has nothing
  ready to keep serving), and a model moved less than ``move_cooldown_s`` ago (hysteresis: no ping-pong).
* Cost = the moved instances' load times; the cheapest set per GPU is taken greedily (cheapest load time
  per byte freed) or a single instance that covers the shortfall alone, whichever costs less.
  A gang's k GPUs are cleared jointly: each k-set of the server's clearable GPUs is tried (cheapest
  alone-costs first, at most ``MAX_GANG_SETS``) and the cheapest joint one wins.
* Payback, the planner's rule extended to moves: gain(1) - L > (1 + h) * sum(move load times), where
  gain(1) = min(T, P / r) is what the waiting model's first instance serves in the next interval and L its
  own load time. h (the hysteresis) keeps moves away from marginal backlogs.
* At most ``max_moves`` moves per plan, over all waiting models.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Protocol

from controlplane.fleet.placement.changes import placement_totals
from controlplane.fleet.placement.payback import payback_gain_s
from controlplane.fleet.placement.types import ModelDemand, ModelProfile, Placement, PlannerParams, Server, ServerState

Key = tuple[str, str, tuple[int, ...]]
GpuId = tuple[str, int]
# k-GPU sets tried jointly per server: C(8, 4) = 70 covers an 8-GPU server's gangs of up to 4 in full; a plan
# runs every interval, so the search stays bounded for larger servers and gangs.
MAX_GANG_SETS = 128
# Joint clearings tried per k-set (each GPU's options times the next's): small fleets are searched in full,
# a large server's search stays bounded.
MAX_CLEARINGS = 256


class PlannerState(Protocol):
    """What consolidation reads from the planner's working state (planner._Planner)."""

    p: PlannerParams
    prof: dict[str, ModelProfile]
    srv: dict[str, Server]
    cap: dict[GpuId, int]
    gpu_idx: dict[str, list[int]]
    alloc: dict[Key, int]
    used: dict[GpuId, int]
    used_peak: dict[GpuId, int]  # per GPU while the plan's additions are loaded and nothing removed yet
    frozen: set[str]  # models already moved by this plan

    def demand(self, m: str) -> ModelDemand: ...
    def pins_ok(self, prof: ModelProfile, sid: str, gpus: tuple[int, ...]) -> bool: ...


@dataclass(frozen=True)
class Move:
    """One instance of ``model`` from ``source`` GPU to ``target`` GPU (both single-GPU keys)."""

    model: str
    source: Key
    target: Key
    load_time_s: float


@dataclass(frozen=True)
class Consolidation:
    model: str  # the model the moves make room for
    server_id: str
    gpus: tuple[int, ...]
    moves: tuple[Move, ...]

    @property
    def cost_s(self) -> float:
        return sum(mv.load_time_s for mv in self.moves)


def movable(st: PlannerState, m: str, waiting: str) -> bool:
    d, prof = st.demand(m), st.prof[m]
    if m == waiting or m in st.frozen or prof.gpus_per_instance != 1 or d.loading:
        return False
    return d.last_moved_at is None or st.p.now - d.last_moved_at >= st.p.move_cooldown_s


class _Trial:
    """A copy of the memory bookkeeping that moves are tried on."""

    def __init__(self, st: PlannerState, reserved: tuple[GpuId, ...]) -> None:
        self.st = st
        self.reserved = set(reserved)
        self.used: dict[GpuId, int] = defaultdict(int, st.used)
        self.peak: dict[GpuId, int] = defaultdict(int, st.used_peak)
        self.alloc = dict(st.alloc)
        self.moves: list[Move] = []

    def copy(self) -> _Trial:
        out = _Trial(self.st, tuple(self.reserved))
        out.used, out.peak = defaultdict(int, self.used), defaultdict(int, self.peak)
        out.alloc, out.moves = dict(self.alloc), list(self.moves)
        return out

    def adopt(self, other: _Trial) -> None:
        self.used, self.peak, self.alloc, self.moves = other.used, other.peak, other.alloc, other.moves

    def free(self, gid: GpuId) -> int:
        return self.st.cap[gid] - self.used[gid]

    def destination(self, m: str) -> GpuId | None:
        """Best fit for one instance of m outside the reserved GPUs, with room now and in the target."""
        prof, st = self.st.prof[m], self.st
        mem, best = prof.memory_per_instance_bytes, None
        for sid in sorted(s for s in st.srv if st.srv[s].state is ServerState.HEALTHY):
            if sid in prof.avoid_servers:
                continue
            for i in st.gpu_idx.get(sid, []):
                gid = (sid, i)
                if gid in self.reserved or not st.pins_ok(prof, sid, (i,)):
                    continue
                if self.free(gid) < mem or st.cap[gid] - self.peak[gid] < mem:
                    continue
                score = (self.free(gid) - mem, (m, sid, (i,)) not in self.alloc, gid)
                if best is None or score < best[0]:
                    best = (score, gid)
        return None if best is None else best[1]

    def move(self, key: Key, dest: GpuId) -> None:
        m, mem = key[0], self.st.prof[key[0]].memory_per_instance_bytes
        target = (m, dest[0], (dest[1],))
        self.used[(key[1], key[2][0])] -= mem
        self.used[dest] += mem
        self.peak[dest] += mem  # the new instance loads while the old one still holds its memory
        self.alloc[key] -= 1
        if not self.alloc[key]:
            del self.alloc[key]
        self.alloc[target] = self.alloc.get(target, 0) + 1
        self.moves.append(Move(m, key, target, self.st.prof[m].load_time_s))


def _units(trial: _Trial, gid: GpuId, waiting: str) -> list[Key]:
    """Single-GPU instances on gid that may move, one entry per instance."""
    out = []
    for key, n in sorted(trial.alloc.items()):
        if key[1] == gid[0] and key[2] == (gid[1],) and movable(trial.st, key[0], waiting):
            out.extend([key] * n)
    return out


def _clearings(trial: _Trial, gid: GpuId, need: int, waiting: str, budget: int) -> list[_Trial]:
    """The ways to free ``need`` bytes on gid within ``budget`` more moves, each a copy of ``trial``: every
    single instance that covers the shortfall alone (cheapest load first), then the greedy set (cheapest
    load time per byte freed). Several, because the cheapest may take a destination that another GPU of
    the same gang needs."""
    prof = trial.st.prof
    if trial.free(gid) >= need:
        return [trial.copy()]

    def cost(k: Key) -> tuple:
        mem = prof[k[0]].memory_per_instance_bytes
        return (prof[k[0]].load_time_s / mem, -mem, k)

    short = need - trial.free(gid)
    units = _units(trial, gid, waiting)
    singles = sorted(
        {k for k in units if prof[k[0]].memory_per_instance_bytes >= short},
        key=lambda k: (prof[k[0]].load_time_s, prof[k[0]].memory_per_instance_bytes, k),
    )
    out = []
    for order in [*([k] for k in singles), sorted(units, key=cost)]:
        attempt = trial.copy()
        for key in order:
            if attempt.free(gid) >= need or len(attempt.moves) - len(trial.moves) >= budget:
                break
            if attempt.alloc.get(key, 0) <= 0:
                continue
            dest = attempt.destination(key[0])
            if dest is not None:
                attempt.move(key, dest)
        if attempt.free(gid) >= need:
            out.append(attempt)
    return out


def _clear_all(st: PlannerState, sid: str, gpus: tuple[int, ...], need: int, waiting: str, budget: int):
    """The cheapest joint clearing of ``gpus`` (a depth-first search over each GPU's clearings, at most
    ``MAX_CLEARINGS`` tried), or None."""
    best: list = []
    tried = 0

    def search(trial: _Trial, rest: tuple[int, ...]) -> None:
        nonlocal tried
        if not rest:
            score = (sum(m.load_time_s for m in trial.moves), len(trial.moves))
            if not best or score < best[0]:
                best[:] = [score, trial]
            return
        for option in _clearings(trial, (sid, rest[0]), need, waiting, budget - len(trial.moves)):
            tried += 1
            if tried > MAX_CLEARINGS:
                return
            search(option, rest[1:])

    search(_Trial(st, tuple((sid, i) for i in gpus)), gpus)
    return best[1] if best else None


def find(st: PlannerState, waiting: str, budget_s: float, max_moves: int) -> Consolidation | None:
    """The cheapest consolidation that gives ``waiting`` one instance, or None (no set of at most
    ``max_moves`` moves whose load times stay under ``budget_s`` frees enough room)."""
    prof = st.prof[waiting]
    k, need = prof.gpus_per_instance, prof.memory_per_instance_bytes
    best = None
    for sid in sorted(s for s in st.srv if st.srv[s].state is ServerState.HEALTHY):
        if not st.pins_ok(prof, sid, ()) or sid in prof.avoid_servers:
            continue
        per_gpu = []
        for i in st.gpu_idx.get(sid, []):
            if not st.pins_ok(prof, sid, (i,)) or st.cap[(sid, i)] < need:
                continue
            trial = _clear_all(st, sid, (i,), need, waiting, max_moves)
            if trial is not None:
                per_gpu.append((sum(m.load_time_s for m in trial.moves), len(trial.moves), i))
        if len(per_gpu) < k:
            continue
        # GPUs that can be cleared one at a time may not be clearable together (their moves want the same
        # destination, or each other's GPU), so every k-set is tried jointly, cheapest alone-costs first.
        sets = sorted(combinations(sorted(per_gpu), k), key=lambda c: (sum(g[0] for g in c), sum(g[1] for g in c)))
        for combo in sets[:MAX_GANG_SETS]:
            chosen = tuple(sorted(i for *_, i in combo))
            trial = _clear_all(st, sid, chosen, need, waiting, max_moves)
            if trial is None:
                continue
            cost = sum(m.load_time_s for m in trial.moves)
            if not cost < budget_s:
                continue
            score = (cost, len(trial.moves), sid, chosen)
            if best is None or score < best[0]:
                best = (score, Consolidation(waiting, sid, chosen, tuple(trial.moves)))
    return None if best is None else best[1]


class Planning(PlannerState, Protocol):
    """The planner's bookkeeping that applying a consolidation writes to."""

    target_n: dict[str, int]
    notes: dict[str, str]
    move_for: dict[Key, str]
    made_room_for: list[str]
    frozen: set[str]

    def add(self, key: Key, n: int, why: str | None = None) -> None: ...
    def count(self, m: str, states: Sequence[ServerState] = ...) -> int: ...


def consolidate(st: Planning, models: list[str], current: Sequence[Placement]) -> bool:
    """Moves that give a waiting model (backlog with a known rate, no instance anywhere) its first
    instance; the models with the most pending lines first, while the interval's move budget lasts.
    Returns whether anything was consolidated."""
    left = st.p.max_moves - st.p.moves_done
    everywhere = (ServerState.HEALTHY, ServerState.CORDONED, ServerState.DRAINING)
    waiting = [
        m
        for m in models
        if st.demand(m).pending_lines > 0
        and st.demand(m).lines_per_second_per_instance > 0
        and st.count(m, everywhere) == 0
        and st.target_n[m] > 0
    ]
    if not waiting or left <= 0:
        return False
    peak = {k: max(n, st.alloc.get(k, 0)) for k, n in placement_totals(current).items()}
    for k, n in st.alloc.items():
        peak.setdefault(k, n)
    st.used_peak = defaultdict(int)
    for k, n in peak.items():
        for i in k[2]:
            st.used_peak[(k[1], i)] += n * st.prof[k[0]].memory_per_instance_bytes
    for m in sorted(waiting, key=lambda m: (-st.demand(m).pending_lines, m)):
        d, prof = st.demand(m), st.prof[m]
        gain = payback_gain_s(d.pending_lines, d.lines_per_second_per_instance, 1, st.p.interval_s)
        budget_s = (gain - prof.load_time_s) / (1 + st.p.hysteresis)
        found = find(st, m, budget_s, left) if budget_s > 0 and left > 0 else None
        if found is None:
            continue
        for mv in found.moves:
            src, dst = mv.source, mv.target
            st.add(src, -1, f"moved to {dst[1]}:gpu{dst[2][0]} to make room for {m} (make-before-break)")
            st.add(dst, 1, f"moved from {src[1]}:gpu{src[2][0]} to make room for {m} (make-before-break)")
            st.move_for[src] = st.move_for[dst] = m
            st.used_peak[(dst[1], dst[2][0])] += st.prof[mv.model].memory_per_instance_bytes
            st.frozen.add(mv.model)  # moved once in this plan: not again for another model
        st.add((m, found.server_id, found.gpus), 1, f"placed after {len(found.moves)} consolidation move(s)")
        gpus = ",".join(str(i) for i in found.gpus)
        st.notes[m] = (
            f"{m}: room made on {found.server_id} gpus [{gpus}] by {len(found.moves)} move(s), {found.cost_s:g}s of loads"
        )
        st.made_room_for.append(m)
        left -= len(found.moves)
    return bool(st.made_room_for)
