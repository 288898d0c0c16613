"""Consolidation moves on the database side: what the planner needs to know about past moves (cooldown,
the interval's budget, models still loading), and the event rows that tell operators which moves were
planned and for which model. The reconciler executes the moves (reconciler.py, execution_phases)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.db.models import Max, Sum
from django.utils import timezone

from controlplane.fleet.models import (
    CatalogueModel,
    Placement,
    PlacementEvent,
    PlacementStatus,
    TritonServer,
    gpus_text,
)
from controlplane.fleet.placement import types as pt

MOVE_IN, MOVE_OUT, CONSOLIDATE = "move_in", "move_out", "consolidate"


def move_history(interval_s: float) -> tuple[dict[int, float], int]:
    """(model id -> when one of its instances last moved in, epoch seconds; instances moved in the last
    ``interval_s``): the planner's cooldown and the interval's move budget."""
    last = {
        row["model_id"]: row["at"].timestamp()
        for row in PlacementEvent.objects.filter(action=MOVE_IN, ok=True, model__isnull=False)
        .values("model_id")
        .annotate(at=Max("created_at"))
    }
    since = timezone.now() - timedelta(seconds=interval_s)
    recent = PlacementEvent.objects.filter(action=MOVE_IN, ok=True, created_at__gte=since).aggregate(
        n=Sum("after") - Sum("before")
    )
    return last, int(recent["n"] or 0)


def models_only_loading() -> set[int]:
    """Models with placements that are all still loading: nothing of theirs is ready to keep serving."""
    statuses: dict[int, set[str]] = defaultdict(set)
    for model_id, status in Placement.objects.filter(instances__gt=0).values_list("model_id", "status"):
        statuses[model_id].add(status)
    return {m for m, s in statuses.items() if PlacementStatus.LOADING in s and PlacementStatus.READY not in s}


def moves_planned_record(plan: pt.Plan, actor: str) -> None:
    """One event per model the plan makes room for, listing its moves, before any of them runs."""
    for waiting in plan.made_room_for:
        halves = [c for c in plan.changes if c.move_for == waiting]
        steps = ", ".join(
            f"{c.model} {'onto' if c.after > c.before else 'off'} {c.server_id}:[{','.join(map(str, c.gpus))}]"
            for c in halves
        )
        placed = next((c for c in plan.changes if c.model == waiting and c.after > c.before), None)
        PlacementEvent.objects.create(
            model=CatalogueModel.objects.filter(triton_name=waiting).first(),
            server=None,
            gpus=",".join(map(str, placed.gpus)) if placed else "",
            action=CONSOLIDATE,
            reason=f"planned {sum(1 for c in halves if c.after > c.before)} move(s) to make room for {waiting}: {steps}",
            actor=actor,
            move_for=waiting,
        )


def move_action(change: pt.Change) -> str:
    """The event action of one change: move_in / move_out for the halves of a move, else the change kind."""
    if not change.move_for:
        return change.kind.value
    return MOVE_IN if change.after > change.before else MOVE_OUT


def change_event_record(
    model: CatalogueModel, server: TritonServer, change: pt.Change, *, reason: str, actor: str, ok: bool = True
) -> None:
    """The PlacementEvent of one applied (or failed) change of a plan."""
    PlacementEvent.objects.create(
        model=model,
        server=server,
        gpus=gpus_text(change.gpus),
        action=move_action(change),
        before=change.before,
        after=change.after,
        ok=ok,
        move_for=change.move_for,
        reason=reason,
        actor=actor,
    )
