"""What a slot does when its message reaches a worker: claim the model's next shard by policy, run it (the
batch pipeline runs and finalizes it: batches.services.shard_run), and repeat for up to SCHEDULER_SLOT_BUDGET_SECONDS; then give the place back (a top-up re-queues it
behind other models' slots, so one model's backlog never holds all worker threads)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.conf import settings

from controlplane.batches.leases import LeaseKeeper
from controlplane.batches.services import shard_run
from controlplane.core.observability.logs import log_context_bind
from controlplane.core.workers.database import when_database_answers
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import Backend
from controlplane.scheduling.call_clock import CallClock
from controlplane.scheduling.claims import shard_claim_next, shard_settle
from controlplane.scheduling.slots import slot_finish, slot_renew, slot_start, slots_topup
from controlplane.triton.client import TransientTritonError

logger = logging.getLogger(__name__)

# A cycle's outcome when the model had nowhere to run (no ready placement, server down): nothing was claimed.
UNROUTABLE = "unroutable"


@dataclass(frozen=True)
class Cycle:
    """What one cycle of a slot did: ``outcome`` is shard_execute's for the shard it claimed (succeeded,
    stopped, deferred, retry, dead, skipped, stale, lease_lost), or UNROUTABLE with ``shard_id`` None."""

    outcome: str
    shard_id: int | None = None


def slot_run(*, slot_id: int, owner: str, backend_factory: Callable[[str], Backend]) -> int:
    """Returns the number of shards this slot ran."""
    slot = slot_start(slot_id=slot_id, owner=owner)
    if slot is None:
        return 0
    model = slot.model
    ran, triton_away = 0, False
    try:
        # The slot's lease is as short as a shard's, renewed in the background while its shards run, so a
        # dead worker's slot is freed as quickly as its shard is rescued.
        with LeaseKeeper(partial(slot_renew, slot_id=slot_id), name=f"slot-{slot_id}-lease") as keeper:
            ran, triton_away = _run_shards(model=model, owner=owner, backend_factory=backend_factory, keeper=keeper)
    finally:
        _slot_finish_through_database_errors(slot_id)
        # With Triton away an immediate top-up would start the next slot only to fail the same way, in a
        # tight loop; beat's top-up (SCHEDULER_TOPUP_INTERVAL_SECONDS) tries again soon enough.
        if not triton_away:
            slots_topup(model_name=model.name)
    return ran


def _slot_finish_through_database_errors(slot_id: int) -> None:
    """Hand the slot's place back even if the database was restarting under the slot (its shard then
    failed with a DatabaseError, which propagates). Left behind, the slot row would count against the
    model's cap until its lease ran out, so every other runnable shard would wait that long too (tests/chaos:
    a Postgres restart held the batch 10 s). Tries for a shard lease at most: the slot's own lease has long
    expired by then, and the next top-up drops the row anyway."""
    when_database_answers(partial(slot_finish, slot_id=slot_id), within_s=settings.SHARD_LEASE_SECONDS)


def _run_shards(
    *, model: CatalogueModel, owner: str, backend_factory: Callable[[str], Backend], keeper: LeaseKeeper
) -> tuple[int, bool]:
    """Returns the shards run, and whether the slot ended because Triton was away."""
    ran = 0
    deadline = time.monotonic() + settings.SCHEDULER_SLOT_BUDGET_SECONDS
    while time.monotonic() < deadline and not keeper.lost.is_set():
        cycle = shard_run_next(model=model, owner=owner, backend_factory=backend_factory)
        if cycle is None:
            break
        if cycle.outcome == UNROUTABLE:
            # Shards stay pending, unclaimed; the next top-up (placement change, beat) gives the model a slot.
            return ran, True
        ran += 1
        if cycle.outcome == "deferred":
            return ran, True  # Triton is away: the slot ends rather than claim shards it cannot run
    return ran, False


def shard_run_next(*, model: CatalogueModel, owner: str, backend_factory: Callable[[str], Backend]) -> Cycle | None:
    """One cycle of a slot: route the model, claim the shard the policy serves next (shard_claim_next: SKIP
    LOCKED, runnable shards only, charged to the tenant's fair share), run it and settle it. None when
    nothing of the model is runnable. The one way shards run, in workers and in tests alike."""
    started = time.monotonic()  # what a shard costs its slot: routing, claim, run, commit
    try:
        backend = CallClock(backend_factory(model.triton_name))
    except TransientTritonError as exc:
        logger.info("%s: model %s has nowhere to run: %s", owner, model.name, exc)
        return Cycle(UNROUTABLE)
    shard = shard_claim_next(model=model, owner=owner)
    if shard is None:
        return None
    log_context_bind(batch_id=shard.batch_id, shard_id=shard.id, shard_index=shard.index, attempt=shard.attempt)
    settle = partial(_settle, shard_id=shard.id, started=started, backend=backend)
    return Cycle(shard_run(shard=shard, model=model, backend=backend, on_succeeded=settle), shard.id)


def _settle(*, shard_id: int, started: float, backend: CallClock) -> None:
    shard_settle(shard_id=shard_id, cycle_seconds=time.monotonic() - started, model_seconds=backend.model_seconds)
