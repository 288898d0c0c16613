"""What a slot does when its message reaches a worker: claim the model's next shard by policy, run it,
and repeat for up to SCHEDULER_SLOT_BUDGET_SECONDS; then give the place back (a top-up re-queues it
behind other models' slots, so one model's backlog never holds all worker threads)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connection

from controlplane.batches.backend import InferenceBackend
from controlplane.batches.execution import shard_execute
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.claims import shard_claim_next, shard_settle
from controlplane.scheduling.slots import slot_finish, slot_renew, slot_start, slots_topup
from controlplane.triton.client import TransientTritonError

logger = logging.getLogger(__name__)


class SlotKeeper:
    """Renews a running slot's lease from a background thread while its shards run, so the lease can be
    as short as a shard's and a dead worker's slot is freed as quickly as its shard is rescued."""

    def __init__(self, slot_id: int):
        self.slot_id = slot_id
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"slot-{slot_id}-keeper", daemon=True)

    def __enter__(self) -> SlotKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        interval = max(0.2, settings.SHARD_LEASE_SECONDS / 3)
        try:
            while not self._stop.wait(interval):
                if not slot_renew(slot_id=self.slot_id):
                    self.lost.set()
                    return
        finally:
            connection.close()  # this thread's own connection


def slot_run(*, slot_id: int, owner: str, backend_factory: Callable[[str], InferenceBackend]) -> int:
    """Returns the number of shards this slot ran."""
    slot = slot_start(slot_id=slot_id, owner=owner)
    if slot is None:
        return 0
    model = slot.model
    try:
        with SlotKeeper(slot_id) as keeper:
            ran = _run_shards(model=model, owner=owner, backend_factory=backend_factory, keeper=keeper)
    finally:
        slot_finish(slot_id=slot_id)
        slots_topup(model_name=model.name)
    return ran


def _run_shards(
    *, model: CatalogueModel, owner: str, backend_factory: Callable[[str], InferenceBackend], keeper: SlotKeeper
) -> int:
    ran = 0
    deadline = time.monotonic() + settings.SCHEDULER_SLOT_BUDGET_SECONDS
    while time.monotonic() < deadline and not keeper.lost.is_set():
        try:
            backend = backend_factory(model.triton_name)
        except TransientTritonError as exc:
            # Nowhere to run it (no ready placement, server down): shards stay pending, unclaimed;
            # the next top-up (placement change, beat) gives the model a slot again.
            logger.info("slot %s: model %s has nowhere to run: %s", keeper.slot_id, model.name, exc)
            break
        shard = shard_claim_next(model=model, owner=owner)
        if shard is None:
            break
        outcome = shard_execute(shard=shard, model=model, backend=backend)
        ran += 1
        if outcome == "succeeded":
            shard_settle(shard_id=shard.id)
        if outcome == "deferred":
            break
    return ran
