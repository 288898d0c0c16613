"""The deadline of one validation attempt, kept by the attempt itself.

The rescuer (validation_rescue.py) starts another attempt when the current one gave no result within
BATCH_VALIDATION_DEADLINE_SECONDS of its start event. Celery's time limits were thought to stop a running
validation before that, but the control worker runs the thread pool, which ignores them: a slow validation
(a huge file, slow storage) ran on beside the attempt that superseded it. So the attempt reads its input
through a stream that stops it a little before the rescuer's deadline, measured from the same event; the
batch stays ``validating`` and the rescuer retries it or, after its last attempt, fails it. What is left after
the last read (the duplicate-id pass, the commit) is short, and a superseded attempt can commit nothing
(early_dispatch.py fences it by attempt number)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import IO

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from controlplane.batches.models import Batch, BatchEvent

# Events that (re)start a validation; the latest one's time is the start of the current attempt's deadline.
VALIDATION_ATTEMPT_EVENTS = ("created", "validation_retried")
# The attempt stops this much before the rescuer's deadline (a tenth of it, at most 30 s): room for clocks of
# different hosts and for the rescuer's interval.
_MARGIN_FRACTION = 0.1
_MAX_MARGIN = timedelta(seconds=30)


class ValidationDeadlinePassed(Exception):
    """The attempt ran out of time; the rescuer decides what happens next."""


def attempt_stop_at(*, batch_id: str, created_at: datetime) -> datetime:
    """When the current attempt of ``batch_id`` must stop reading: the deadline counts from the latest (re)start
    event or the moment the batch took its validation turn (turns.py), whichever is later, as the rescuer's does."""
    started = (
        BatchEvent.objects.filter(batch_id=batch_id, kind__in=VALIDATION_ATTEMPT_EVENTS).aggregate(
            last=Max("created_at")
        )["last"]
        or created_at
    )
    turn = Batch.objects.filter(id=batch_id).values_list("validation_started_at", flat=True).first()
    if turn is not None:
        started = max(started, turn)
    deadline = timedelta(seconds=settings.BATCH_VALIDATION_DEADLINE_SECONDS)
    return started + deadline - min(deadline * _MARGIN_FRACTION, _MAX_MARGIN)


class DeadlineStream:
    """``stream`` whose reads raise ValidationDeadlinePassed once ``stop_at`` has passed. The check is a clock
    read per line, a few tens of nanoseconds beside the line's parse."""

    def __init__(self, stream: IO[bytes], *, stop_at: datetime):
        self._stream = stream
        self._stop = time.monotonic() + (stop_at - timezone.now()).total_seconds()

    def _check(self) -> None:
        if time.monotonic() >= self._stop:
            raise ValidationDeadlinePassed()

    def readline(self, size: int = -1) -> bytes:
        self._check()
        return self._stream.readline(size)

    def read(self, size: int = -1) -> bytes:
        self._check()
        return self._stream.read(size)
