"""Celery tasks of the scheduler: thin wrappers over slots and the slot runner."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from controlplane.core.observability.logs import log_context_bind
from controlplane.fleet.backend import backend_for_model
from controlplane.scheduling.runner import slot_run
from controlplane.scheduling.slots import slots_topup

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


# A slot is a permission to run shards of one model; it carries no shard id, and claims by policy
# when it starts. A redelivered or late message finds its slot gone and does nothing.
@shared_task(name="scheduling.slot_run")
def slot_run_task(slot_id: int) -> int:
    log_context_bind(slot=slot_id)
    return slot_run(slot_id=slot_id, owner=WORKER_ID, backend_factory=backend_for_model)


@shared_task(name="scheduling.slots_topup")
def slots_topup_task(model_name: str | None = None) -> dict[str, int]:
    return slots_topup(model_name=model_name)
