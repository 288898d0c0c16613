"""From a target placement to the reconciler's steps (pure, like planner.py).

``diff_placements`` gives the changes in make-before-break order; ``execution_phases`` is the order the
reconciler runs them in: a removal that frees a GPU another model's addition lands on comes first; a
consolidated model's load needs the memory its moves free, so it comes after the removals, and every other
addition (moved instances included) before them, so a moved model is ready at its new place before its old
instance goes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from controlplane.fleet.placement.types import Change, ChangeKind, Placement, Plan

Key = tuple[str, str, tuple[int, ...]]  # (model, server_id, gpus)


def diff_placements(current: Iterable[Placement], target: Iterable[Placement]) -> list[Change]:
    """Changes turning ``current`` into ``target``: every load/scale_up (sorted by key) before any
    scale_down/unload, so capacity is added before it is taken away and no request fails mid-move."""
    cur, tgt = placement_totals(current), placement_totals(target)
    adds: list[Change] = []
    removes: list[Change] = []
    for key in sorted(cur.keys() | tgt.keys()):
        before, after = cur.get(key, 0), tgt.get(key, 0)
        if before == after:
            continue
        if after > before:
            adds.append(Change(ChangeKind.LOAD if before == 0 else ChangeKind.SCALE_UP, *key, before, after))
        else:
            kind = ChangeKind.UNLOAD if after == 0 else ChangeKind.SCALE_DOWN
            removes.append(Change(kind, *key, before, after))
    return adds + removes


def placement_totals(placements: Iterable[Placement]) -> dict[Key, int]:
    out: dict[Key, int] = defaultdict(int)
    for p in placements:
        out[p.key] += p.instances
    return dict(out)


def execution_phases(plan: Plan) -> list[list[Change]]:
    """[removals on a GPU that an addition lands on, additions (moves' new instances included), the other
    removals (moves' old instances included), loads of the models the moves made room for]; empty phases are
    left out. The plan fits each GPU once all of it has run, not halfway: an idle model unloaded to make room for
    another on its GPU goes before that load, or the GPU briefly held both (a placement scenario saw five 64 MiB
    instances on a 256 MiB GPU: one model's load before the other's unload). A move's old instance is not
    among the first: make-before-break is what moves are for, and their room is the last phase's."""
    last = set(plan.made_room_for)
    grow = [c for c in plan.changes if c.after > c.before and c.model not in last]
    shrink = [c for c in plan.changes if c.after < c.before]
    placed = [c for c in plan.changes if c.after > c.before and c.model in last]
    landing = {(c.server_id, gpu) for c in grow for gpu in c.gpus}
    first = [c for c in shrink if not c.move_for and any((c.server_id, gpu) in landing for gpu in c.gpus)]
    rest = [c for c in shrink if c not in first]
    return [phase for phase in (first, grow, rest, placed) if phase]
