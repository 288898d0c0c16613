"""Shards that run while the rest of their file is still being validated, invisible until it is valid.

Validation (batches/intake/validation.py) plans shards as it streams the file; each planned shard is added to the
database as soon as it closes (at most every FLUSH_SECONDS; not the file's last, which the verdict follows at
once), so the scheduler runs the first shards while the control worker checks the rest: on the hot-path benchmark validation was a quarter of the end-to-end
time, on one core, with the other idle. Nothing of it shows before the whole file is valid:

- the batch stays ``validating``; the API shows no request counts and no usage for it (render.py);
- a shard that commits while its batch validates writes no ledger row (shards.shard_commit): the rows are
  written when validation succeeds (``usage_rows.held_usage_record``), in the transaction that makes the batch
  ``in_progress``, so a tenant is never charged for a batch that then fails;
- if the file turns out invalid, or the batch is cancelled while validating, its shards are deleted with the
  terminal state (``shards_discard``): a running shard's commit and lease renewals then match no row, so it
  publishes nothing, and its part is deleted (or collected by batches/results/retention.py's parts_collect). The
  shards that had finished are charged first: ledger rows marked ``discarded`` (the GPU time was spent; the
  spend cap counts them). A superseded attempt is the service's doing and charges nothing;
- a batch that expires while validating keeps its shards: the pending ones are skipped, a running one stops
  between calls and commits what it finished, and validation goes on; once the file is valid the batch starts
  (its finished shards charged, as any expired batch's finished lines are) and finalizes at once, every other
  line ``batch_expired`` (services.batch_validate);
- each validation attempt takes a number (Batch.validation_attempt): a redelivered or rescued attempt
  discards the shards of the one it supersedes, and the superseded one can add and settle nothing.

A shard of a validating batch is charged to the tenant's fair share when claimed like any other: the
capacity was used either way."""

from __future__ import annotations

import contextlib
import time
from functools import partial
from typing import Any

from django.db import transaction

from controlplane.batches.intake.validation import ShardPlan, ValidationResult
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.usage_rows import held_usage_record
from controlplane.core.messaging import dispatch
from controlplane.files.storage import blob_delete

# Planned shards reach the database at most this often (the first one at once): each flush is a transaction
# and a slot top-up, while validation plans a shard of 4,096 identity lines every ~40 ms. At 0.5 s the slots
# sat idle for the first half second and ran the shards after validation (bench/hotpath.py at 100k lines:
# 0.52 of the reference); at 0.1 s they keep pace with it (0.56) for the same CPU, and another tenant's small
# batch beside the validating file took 1.29x its time alone against 1.21x (bench/validation_abuse.py).
FLUSH_SECONDS = 0.1


class ValidationSuperseded(Exception):
    """A newer attempt owns the batch's validation (or the batch left ``validating``): stop quietly."""


def validation_attempt_begin(*, batch_id: str) -> int | None:
    """Take the next attempt number and discard what an earlier attempt left; None when the batch is no
    longer validating."""
    with transaction.atomic():
        row = Batch.objects.select_for_update().filter(id=batch_id, status=BatchStatus.VALIDATING).first()
        if row is None:
            return None
        attempt = row.validation_attempt + 1
        Batch.objects.filter(id=batch_id).update(validation_attempt=attempt)
        if attempt > 1:  # only an earlier attempt can have left shards
            shards_discard(batch_id=batch_id)
    return attempt


class EarlyShards:
    """The validator's callback: adds each planned shard of a so-far-valid file to the database, so that
    slots can run it. ``added`` is how many of the plan's shards are in the database."""

    def __init__(self, *, batch_id: str, attempt: int) -> None:
        self.batch_id = batch_id
        self.attempt = attempt
        self.added = 0
        self._pending: list[ShardPlan] = []
        self._model = ""
        self._snapshot: dict[str, Any] | None = None
        self._last_flush = 0.0

    def __call__(self, plan: ShardPlan, result: ValidationResult) -> None:
        if result.error_count or not result.model_snapshot:
            return  # the batch will fail (or the model is unknown): nothing more runs early
        self._model, self._snapshot = result.model, result.model_snapshot
        self._pending.append(plan)
        if time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        with transaction.atomic():
            owned = (
                Batch.objects.select_for_update()
                .filter(id=self.batch_id, status=BatchStatus.VALIDATING, validation_attempt=self.attempt)
                .exists()
            )
            if not owned:
                raise ValidationSuperseded()
            if self.added == 0:
                Batch.objects.filter(id=self.batch_id).update(model=self._model, model_snapshot=self._snapshot)
            Shard.objects.bulk_create(shard_rows(self.batch_id, self._pending))
            # The dispatcher decides when they run (Postgres is the queue); sent after the commit.
            dispatch.slots_topup_enqueue(self._model)
        self.added += len(self._pending)
        self._pending = []
        self._last_flush = time.monotonic()


def shard_rows(batch_id: str, plans: list[ShardPlan]) -> list[Shard]:
    return [
        Shard(
            batch_id=batch_id,
            index=plan.index,
            start_line=plan.start_line,
            end_line=plan.end_line,
            start_byte=plan.start_byte,
            end_byte=plan.end_byte,
            request_count=plan.request_count,
            work_units=plan.work_units,
            columns_name=plan.columns_name,
            body_errors=plan.body_errors,
            adapter_lines=plan.adapter_lines,
        )
        for plan in plans
    ]


def shards_discard(*, batch_id: str, charge: bool = False) -> int:
    """Inside the transaction that ends a validating batch (or starts a new attempt): its shards go, with
    the counts their commits added; their parts and columns are deleted once that transaction commits.
    ``charge``: the tenant failed or cancelled the batch, so the shards that finished get their ledger rows
    (marked discarded) before they go."""
    if charge:
        held_usage_record(batch_id=batch_id, discarded=True)
    shards = Shard.objects.filter(batch_id=batch_id)
    parts = [name for pair in shards.values_list("part_name", "columns_name") for name in pair if name]
    deleted, _ = shards.delete()
    if deleted:
        Batch.objects.filter(id=batch_id).update(
            completed_lines=0, failed_lines=0, prompt_tokens=0, completion_tokens=0, cached_tokens=0
        )
    for name in parts:
        transaction.on_commit(partial(_delete_quietly, name))
    return deleted


def _delete_quietly(name: str) -> None:
    with contextlib.suppress(OSError):  # files/storage_gc.py collects a part that no shard names
        blob_delete(name)
