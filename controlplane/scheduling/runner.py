"""What a slot does when its message reaches a worker: claim the model's next shard by policy, run it,
and repeat for up to SCHEDULER_SLOT_BUDGET_SECONDS; then give the place back (a top-up re-queues it
behind other models' slots, so one model's backlog never holds all worker threads)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from django.conf import settings

from controlplane.batches.backend import InferenceBackend
from controlplane.batches.execution import shard_execute
from controlplane.scheduling.claims import shard_claim_next, shard_settle
from controlplane.scheduling.slots import slot_finish, slot_renew, slot_start, slots_topup
from controlplane.triton.client import TransientTritonError

logger = logging.getLogger(__name__)


def slot_run(*, slot_id: int, owner: str, backend_factory: Callable[[str], InferenceBackend]) -> int:
    """Returns the number of shards this slot ran."""
    slot = slot_start(slot_id=slot_id, owner=owner)
    if slot is None:
        return 0
    model = slot.model
    ran = 0
    deadline = time.monotonic() + settings.SCHEDULER_SLOT_BUDGET_SECONDS
    try:
        while time.monotonic() < deadline:
            try:
                backend = backend_factory(model.triton_name)
            except TransientTritonError as exc:
                # Nowhere to run it (no ready placement, server down): shards stay pending, unclaimed;
                # the next top-up (placement change, beat) gives the model a slot again.
                logger.info("slot %s: model %s has nowhere to run: %s", slot_id, model.name, exc)
                break
            shard = shard_claim_next(model=model, owner=owner)
            if shard is None:
                break
            outcome = shard_execute(shard=shard, model=model, backend=backend)
            ran += 1
            if outcome == "succeeded":
                shard_settle(shard_id=shard.id)
            if outcome == "deferred" or not slot_renew(slot_id=slot_id):
                break
    finally:
        slot_finish(slot_id=slot_id)
        slots_topup(model_name=model.name)
    return ran
