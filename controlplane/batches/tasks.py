"""Celery tasks: thin, idempotent wrappers that load by id and call a service.

Every task may run twice (acks_late + redelivery, the rescuer, a beat overlap); the services'
conditional updates make the second run a no-op. Shards are not tasks: the scheduler's slots run them
(controlplane/scheduling/tasks.py)."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from controlplane.batches import services, shards
from controlplane.batches.intake import validation_rescue
from controlplane.batches.results import finalize, rerun_input, retention
from controlplane.core.observability.logs import log_context_bind
from controlplane.files.storage_gc import orphans_collect
from controlplane.webhooks.housekeeping import webhooks_housekeep

# A database restart or failover mid-validation (services.batch_validate re-raises a lost connection): tried
# again after 2, 4, 8, 16, 32 s rather than at the rescuer's deadline (BATCH_VALIDATION_DEADLINE_SECONDS, 20 min);
# each try is a new validation attempt that supersedes the dead one.
VALIDATE_DB_RETRIES = 5


@shared_task(
    name="batches.batch_validate",
    autoretry_for=(OperationalError, InterfaceError),
    max_retries=VALIDATE_DB_RETRIES,
    retry_backoff=2,
    retry_backoff_max=32,
    retry_jitter=False,
    # The validation worker's process pool enforces time limits: past the attempt's own deadline (which stops it a
    # little before BATCH_VALIDATION_DEADLINE_SECONDS from its turn), never the global ones, which would end a large
    # file's validation that its deadline still allows.
    soft_time_limit=settings.BATCH_VALIDATION_DEADLINE_SECONDS + 60,
    time_limit=settings.BATCH_VALIDATION_DEADLINE_SECONDS + 120,
)
def batch_validate_task(batch_id: str, waiting: bool = False) -> None:
    """``waiting``: the message of a batch waiting its validation turn (batches/intake/turns.py)."""
    log_context_bind(batch_id=batch_id)
    # A re-run's input is built here first, from its source's failed lines (batches/results/rerun.py): the request
    # that created it only reserved the input's id.
    if rerun_input.rerun_input_ready(batch_id=batch_id):
        services.batch_validate(batch_id=batch_id, waiting=waiting)


@shared_task(name="batches.batch_finalize")
def batch_finalize_task(batch_id: str, taken: bool = False) -> bool:
    """``taken``: the rescuer already moved the batch into finalizing (finalize.batches_finalize_stuck)."""
    log_context_bind(batch_id=batch_id)
    if taken:
        finalize.batch_finalize(batch_id=batch_id)
        return True
    return finalize.batch_try_finalize(batch_id=batch_id)


@shared_task(name="batches.shards_rescue")
def shards_rescue_task() -> int:
    """The rescuer: every non-terminal state has a deadline. validating (validation_rescue.batches_validation_rescue),
    in_progress and cancelling (expired shard leases, then batches whose shards are all closed) and
    finalizing (a dead finalizer) each reach a terminal state or visibly progress."""
    validation_rescue.batches_validation_rescue()
    runnable = shards.shards_rescue()
    finalize.batches_finalize_stuck()
    return len(runnable)


@shared_task(name="batches.batches_expire")
def batches_expire_task() -> int:
    return len(services.batches_expire())


@shared_task(name="batches.spend_caps_enforce")
def spend_caps_enforce_task() -> int:
    return len(services.batches_stop_spend_capped())


# Data lifecycle (batches/results/retention.py; files' expiry and orphan collection are files/retention.py,
# files/storage_gc.py, the expiry task files/tasks.py): each run is bounded; the next goes on.
@shared_task(name="batches.history_prune")
def history_prune_task() -> dict[str, int]:
    now = timezone.now()
    # The webhook delivery log ages on the same sweep, and each endpoint's waiting deliveries are capped.
    return retention.history_prune(now=now) | webhooks_housekeep(now=now)


@shared_task(name="batches.storage_collect")
def storage_collect_task() -> int:
    now = timezone.now()
    # Parts of ended batches first: a part whose shard row a prune removed is an orphan the second sweep finds.
    return retention.parts_collect(now=now) + len(orphans_collect(now=now))
