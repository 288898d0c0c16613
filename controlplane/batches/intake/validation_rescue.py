"""The deadline on ``validating``: a validation that gave no result in time is tried again, and failed after
VALIDATION_MAX_ATTEMPTS (each new attempt supersedes the last: batches/intake/early_dispatch.py)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, Q
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from controlplane.batches.intake.validation_deadline import VALIDATION_ATTEMPT_EVENTS
from controlplane.batches.intake.verdict import batch_validation_fail, validation_error_entry
from controlplane.batches.models import Batch, BatchEvent, BatchStatus
from controlplane.batches.transitions import event_record
from controlplane.core.messaging import dispatch
from controlplane.core.workers.deadlines import job_time_up

# Tries of a batch's validation (the first enqueue at create included) before the rescuer fails it.
VALIDATION_MAX_ATTEMPTS = 3
# The running attempt stops itself before this deadline (validation_deadline.py), so a retry never runs beside it.
_VALIDATION_ATTEMPT_EVENTS = VALIDATION_ATTEMPT_EVENTS


def batches_validation_rescue() -> list[str]:
    """Batches left in ``validating`` past BATCH_VALIDATION_DEADLINE_SECONDS since their last attempt, their turn
    and their last give-back of a turn (turns.py: a batch that waits its tenant's turn is not lost), because the
    validate message was lost, the worker died or a lost database connection was re-raised, are enqueued
    again, and after VALIDATION_MAX_ATTEMPTS attempts failed with a ``validation_error`` entry, so none
    stays there forever. Attempts are counted from the batch's events (``created`` and each
    ``validation_retried``), which also show them to operators. Returns the ids acted on.

    Safe to run concurrently: each batch is decided under its row lock, and a validation that finishes
    meanwhile moves the batch on, after which the conditional updates here match nothing."""
    deadline = timezone.now() - timedelta(seconds=settings.BATCH_VALIDATION_DEADLINE_SECONDS)
    overdue = (
        Batch.objects.filter(status=BatchStatus.VALIDATING)
        .annotate(
            last_attempt_at=Coalesce(
                Max("events__created_at", filter=Q(events__kind__in=_VALIDATION_ATTEMPT_EVENTS)), "created_at"
            ),
            # Each argument coalesced: SQLite's MAX() of a NULL is NULL, Postgres's GREATEST skips it.
            last_sign_at=Greatest(
                "last_attempt_at",
                Coalesce("validation_started_at", "created_at"),
                Coalesce("validation_waiting_at", "created_at"),
            ),
        )
        .filter(last_sign_at__lt=deadline)
    )
    rescued: list[str] = []
    for batch_id in list(overdue.values_list("id", flat=True)):
        if job_time_up():
            break  # the next run goes on (core/workers/deadlines.py)
        with transaction.atomic():
            batch = Batch.objects.select_for_update().filter(id=batch_id, status=BatchStatus.VALIDATING).first()
            if batch is None:
                continue  # validated, cancelled or expired since the query
            attempts = BatchEvent.objects.filter(batch_id=batch_id, kind__in=_VALIDATION_ATTEMPT_EVENTS)
            last_attempt_at = attempts.aggregate(last=Max("created_at"))["last"] or batch.created_at
            signs = (last_attempt_at, batch.validation_started_at, batch.validation_waiting_at)
            if max(sign for sign in signs if sign is not None) >= deadline:
                continue  # another rescuer retried it, or it took or gave back its turn, while we queried
            tries = max(1, attempts.count())
            if tries >= VALIDATION_MAX_ATTEMPTS:
                batch_validation_fail(
                    batch, [validation_error_entry(batch.id, f"Validation did not finish after {tries} attempts")]
                )
            else:
                event_record(
                    batch_id=batch_id,
                    kind="validation_retried",
                    message=(
                        f"attempt {tries + 1} of {VALIDATION_MAX_ATTEMPTS}: attempt {tries} gave no result "
                        f"within {settings.BATCH_VALIDATION_DEADLINE_SECONDS} s"
                    ),
                )
                dispatch.batch_validate_enqueue(batch_id)
        rescued.append(batch_id)
    return rescued
