"""Dispatch slots: the dispatcher keeps queued + running slots per model at most the model's slot cap,
and only as many queued as there are runnable shards, so the broker never holds a backlog.

Top-ups happen when a slot ends (it ran its shards and hands its place back), when a batch becomes
runnable or a shard is rescued (via core.messaging.dispatch), when placements change, and on every beat. Each
top-up holds the model's catalogue row lock, so two top-ups never exceed the cap together."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.batches.leases import lease_renew_interval
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling import selectors
from controlplane.scheduling.models import Slot, SlotState

logger = logging.getLogger(__name__)


def slots_topup(*, model_name: str | None = None) -> dict[str, int]:
    """Create and enqueue the slots each model needs now. Returns model name → slots created."""
    now = timezone.now()
    # Queued slots whose message was lost and running slots whose worker died stop counting, every model's.
    Slot.objects.filter(expires_at__lt=now).delete()
    # Only a model with a runnable shard can want a slot (a queued slot per runnable shard at most, below): one
    # query instead of four or more per enabled model, on every beat of an idle fleet (12.7 -> 1.7 ms of CPU here).
    models = CatalogueModel.objects.filter(is_enabled=True)
    if model_name:
        models = models.filter(name=model_name)
    models = selectors.models_with_runnable_shards(models, now)
    created: dict[str, int] = {}
    for model_id in list(models.values_list("id", flat=True)):
        name, count = _topup_one(model_id, now)
        if count:
            created[name] = count
    return created


def _topup_one(model_id: int, now: datetime) -> tuple[str, int]:
    with transaction.atomic():
        # The per-model lock: concurrent top-ups of one model take turns here. Expired slots went in slots_topup;
        # one that expired since counts until the next top-up (fewer slots for a moment, never more).
        model = CatalogueModel.objects.select_for_update().get(id=model_id)
        live = dict.fromkeys(SlotState.values, 0)
        for state in Slot.objects.filter(model_id=model_id).values_list("state", flat=True):
            live[state] += 1
        cap = selectors.model_slot_cap(model)
        room = cap - live[SlotState.QUEUED] - live[SlotState.RUNNING]
        if room <= 0 or model.paused:
            return model.name, 0
        # A queued slot per runnable shard at most: slots without work would only cycle on the broker.
        runnable = selectors.runnable_shards(model=model, now=now)[: cap + live[SlotState.QUEUED]].count()
        wanted = min(room, runnable - live[SlotState.QUEUED])
        if wanted <= 0:
            return model.name, 0
        expires = now + timedelta(seconds=settings.SCHEDULER_SLOT_QUEUED_SECONDS)
        slots = Slot.objects.bulk_create(Slot(model_id=model_id, expires_at=expires) for _ in range(wanted))
        for slot in slots:
            dispatch.slot_enqueue(slot.id)
    logger.debug("model %s: %d new slots (cap %d)", model.name, wanted, cap)
    return model.name, wanted


def _running_lease() -> timedelta:
    # Three renewals (3 s by default): the slot runner renews it every second in the background while its
    # shards run (runner.slot_run, batches.leases.LeaseKeeper), so a live slot survives two missed renewals,
    # and a killed worker's slots stop counting against the cap within seconds. A whole shard
    # lease (10 s) would make the model's other shards wait that long after every worker death, and rescued
    # shards of one kill wait again for the slots of the next (tests/chaos measured 20 s).
    return timedelta(seconds=min(settings.SHARD_LEASE_SECONDS, 3 * lease_renew_interval()))


def slot_start(*, slot_id: int, owner: str) -> Slot | None:
    """Take a queued slot. None: the slot expired (its message arrived late) or was already taken by a
    redelivered copy of the message — either way this delivery has nothing to do."""
    won = Slot.objects.filter(id=slot_id, state=SlotState.QUEUED, expires_at__gte=timezone.now()).update(
        state=SlotState.RUNNING, owner=owner[:200], expires_at=timezone.now() + _running_lease()
    )
    if won != 1:
        return None
    return Slot.objects.select_related("model").get(id=slot_id)


def slot_renew(*, slot_id: int) -> bool:
    """False when the slot row is gone (expired and replaced): the caller stops after its current shard."""
    return (
        Slot.objects.filter(id=slot_id, state=SlotState.RUNNING).update(expires_at=timezone.now() + _running_lease())
        == 1
    )


def slot_finish(*, slot_id: int) -> None:
    Slot.objects.filter(id=slot_id).delete()
