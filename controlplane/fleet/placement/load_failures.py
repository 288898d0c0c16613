"""Failed loads: the placement row that keeps a model off a server for a while after its load failed there
(the reconciler's `_apply_group`; the planner reads the rows as servers to avoid, reconciler.planner_inputs)."""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.fleet.models import (
    CatalogueModel,
    Placement,
    PlacementStatus,
    TritonServer,
    gpus_text,
)
from controlplane.fleet.placement import types as pt
from controlplane.fleet.placement.moves import change_event_record

# A failed load is not retried on the same server for a while (the planner may place the model elsewhere): 10 s
# after the first failure, doubling with each one in a row up to 2 min. A flat 2 min kept a model off its only
# server that long after one transient failure (a load refused while a restarted Triton was still settling).
LOAD_FAILURE_BACKOFF_FIRST = timedelta(seconds=10)
LOAD_FAILURE_BACKOFF_MAX = timedelta(minutes=2)


def load_failure_backoff(failures: int) -> timedelta:
    """How long a server is avoided for a model after its ``failures``-th failed load there in a row."""
    return min(LOAD_FAILURE_BACKOFF_MAX, LOAD_FAILURE_BACKOFF_FIRST * 2 ** min(max(failures, 1) - 1, 16))


def load_failure_record(
    model: CatalogueModel, server: TritonServer, changes: list[pt.Change], error: str, actor: str
) -> None:
    """The load of ``changes`` failed with ``error``: each change's row keeps its old instances, and the server
    is avoided for the model until the backoff of its failures in a row there has passed."""
    now = timezone.now()
    with transaction.atomic():
        failed_before = dict(
            Placement.objects.select_for_update()
            .filter(model=model, server=server)
            .values_list("gpus", "load_failures")
        )
        for c in changes:
            failures = failed_before.get(gpus_text(c.gpus), 0) + 1
            Placement.objects.update_or_create(
                model=model,
                server=server,
                gpus=gpus_text(c.gpus),
                defaults={
                    "instances": c.before,
                    "status": PlacementStatus.FAILED if c.before == 0 else PlacementStatus.READY,
                    "failed_until": now + load_failure_backoff(failures),
                    "last_error": error[:2000],
                    "load_failures": failures,
                },
            )
            change_event_record(model, server, c, reason=error[:2000], actor=actor, ok=False)
