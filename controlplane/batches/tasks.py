"""Celery tasks: thin, idempotent wrappers that load by id and call a service.

Every task may run twice (acks_late + redelivery, the rescuer, a beat overlap); the services'
conditional updates make the second run a no-op."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from controlplane.batches import finalize, services, shards
from controlplane.batches.backend import backend_for_model
from controlplane.batches.execution import ShardDeferred, shard_run

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="batches.batch_validate")
def batch_validate_task(batch_id: str) -> None:
    services.batch_validate(batch_id=batch_id)


# Bounded retries with exponential backoff for a Triton that stays unavailable; the shard's own
# attempt counter (SHARD_MAX_ATTEMPTS) is the final bound across retries and rescues.
@shared_task(name="batches.shard_process", bind=True, max_retries=8)
def shard_process_task(self, shard_id: int) -> str:  # type: ignore[no-untyped-def]
    try:
        return shard_run(shard_id=shard_id, owner=WORKER_ID, backend_factory=backend_for_model)
    except ShardDeferred as exc:
        raise self.retry(exc=exc, countdown=min(60, 2 ** self.request.retries)) from exc


@shared_task(name="batches.batch_finalize")
def batch_finalize_task(batch_id: str) -> bool:
    return finalize.batch_try_finalize(batch_id=batch_id)


@shared_task(name="batches.shards_rescue")
def shards_rescue_task() -> int:
    requeued = shards.shards_rescue()
    finalize.batches_finalize_stuck()
    return len(requeued)


@shared_task(name="batches.batches_expire")
def batches_expire_task() -> int:
    return len(services.batches_expire())
