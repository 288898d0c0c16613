"""Running shards in tests the way a worker's slot does (scheduling/runner.shard_run_next): the production
claim by policy (SKIP LOCKED, runnable shards only: not deferred, nobody paused; charged to the tenant's fair
share), the run, the settle. There is no other way to run a shard, so tests cover the path workers take."""

from __future__ import annotations

from typing import Any

from controlplane.batches.models import Batch, Shard
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.runner import UNROUTABLE, Cycle, shard_run_next


def run_next(model: str, backend: Any, *, owner: str = "test") -> Cycle | None:
    """One cycle of a slot of catalogue model ``model``: None when nothing of it is runnable."""
    return shard_run_next(
        model=CatalogueModel.objects.get(name=model), owner=owner, backend_factory=lambda name: backend
    )


def run_shard(shard: Shard, backend: Any, *, owner: str = "test") -> str:
    """Run the shard the policy serves next, which the test expects to be ``shard``; returns its outcome."""
    model = Batch.objects.values_list("model", flat=True).get(id=shard.batch_id)
    cycle = run_next(model, backend, owner=owner)
    assert cycle is not None and cycle.shard_id == shard.id, f"expected shard {shard.id} to run next, ran {cycle}"
    return cycle.outcome


def run_batch(batch: Batch, backend: Any, *, owner: str = "test") -> list[str]:
    """Run shards of the batch's model, as its slots would, until none is runnable (a deferred or retried
    shard waits out its not_before); their outcomes in order. Each shard run must be this batch's."""
    model = Batch.objects.values_list("model", flat=True).get(id=batch.id)
    outcomes = []
    while (cycle := run_next(model, backend, owner=owner)) is not None and cycle.outcome != UNROUTABLE:
        assert Shard.objects.filter(id=cycle.shard_id, batch_id=batch.id).exists(), f"ran another batch's {cycle}"
        outcomes.append(cycle.outcome)
    return outcomes
