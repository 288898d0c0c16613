"""The one place that puts messages on the broker.

Services never import task modules (tasks import services): they name the task here, and the message
is sent after the surrounding transaction commits, so a worker never sees a row that is not there yet.
Postgres holds the queue; the broker carries only these few kinds of message."""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

VALIDATE = "batches.batch_validate"
FINALIZE = "batches.batch_finalize"
TOPUP = "scheduling.slots_topup"
SLOT = "scheduling.slot_run"

# Slots go to their own queue so control work (validation, finalization, beat jobs) never waits
# behind a backlog of model work.
_QUEUES = {SLOT: "shards"}


def send(task_name: str, args: list[Any]) -> None:
    """Publish now (tests replace this to drive the services by hand)."""
    current_app.send_task(task_name, args=args, queue=_QUEUES.get(task_name, "control"))


def _on_commit(task_name: str, args: list[Any]) -> None:
    transaction.on_commit(lambda: send(task_name, args))


def batch_validate_enqueue(batch_id: str) -> None:
    _on_commit(VALIDATE, [batch_id])


def batch_finalize_enqueue(batch_id: str) -> None:
    _on_commit(FINALIZE, [batch_id])


def slots_topup_enqueue(model_name: str | None = None) -> None:
    """Ask the dispatcher to top up a model's slots (every model's when None)."""
    _on_commit(TOPUP, [model_name])


def slot_enqueue(slot_id: int) -> None:
    _on_commit(SLOT, [slot_id])
