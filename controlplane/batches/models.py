from __future__ import annotations

from typing import ClassVar

from django.db import models

from controlplane.core.models import new_public_id
from controlplane.tenants.models import Priority, Tenant


def new_batch_id() -> str:
    return new_public_id("batch_")


class Endpoint(models.TextChoices):
    """The batch endpoints: exactly the urls of kinds/registry.KINDS (tests/kinds/test_registry.py)."""

    EMBEDDINGS = "/v1/embeddings"
    # Generic tensor endpoint: a KServe v2 inference request (plus "model") as the line's body.
    TENSORS = "/v2/infer"
    # Text generation (kinds/generation/kind.py): OpenAI's chat, legacy completions and Responses requests.
    CHAT_COMPLETIONS = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    RESPONSES = "/v1/responses"


class BatchStatus(models.TextChoices):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)
# The batches whose shards run: a validating batch's too, unseen until its file proves valid
# (batches/intake/early_dispatch.py).
RUNNABLE_BATCH_STATUSES = (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)


class StopReason(models.TextChoices):
    CANCEL = "cancel"
    EXPIRE = "expire"
    # The tenant reached its monthly spend cap while the batch ran (batches.services.batches_stop_spend_capped).
    SPEND_CAP = "spend_cap"


class Batch(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_batch_id, editable=False)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="batches")
    endpoint = models.CharField(max_length=64, choices=Endpoint.choices)
    # A plain id, not a foreign key: the tenant may delete the input file once the batch is done.
    input_file_id = models.CharField(max_length=40, db_index=True)
    # What the batch needs of its input file, kept at create as model_snapshot keeps the model: validation,
    # execution and finalization read the input's blob by this name and never ask files (selectors.batch_input_name).
    # A re-run's is the name its input will be stored under (files/services.file_reserve). Blank only on rows
    # the last release wrote (db_default, for its INSERTs during a rolling upgrade).
    input_storage_name = models.CharField(max_length=500, blank=True, default="", db_default="")
    # The input's non-blank lines counted at upload (File.line_count), for the enqueued-lines quota while the
    # batch validates (selectors.batch_enqueued_lines). Null when unknown: an older upload, or a re-run's input.
    input_line_count = models.PositiveBigIntegerField(null=True, blank=True)
    completion_window = models.CharField(max_length=16)
    status = models.CharField(max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING)
    stop_reason = models.CharField(max_length=16, choices=StopReason.choices, null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.NORMAL)
    # Estimated work units (tokens for embeddings, rows for tensors) of the whole input, from validation.
    work_units = models.PositiveBigIntegerField(default=0)
    # What the batch counts against its tenant's enqueued-token quota (batches/intake/admission.py): its work units,
    # or for generation its prompts and n × max_tokens of each line. 0 on rows written before it was counted.
    quota_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    # When a shard of this batch was last claimed (or the batch became runnable): the age for aging.
    last_dispatched_at = models.DateTimeField(null=True, blank=True)
    # Set when the scheduler first found the batch at risk of missing expires_at; it then stays above
    # every class until its work is done.
    deadline_promoted_at = models.DateTimeField(null=True, blank=True)
    errors = models.JSONField(null=True, blank=True)
    model = models.CharField(max_length=200, blank=True, default="")
    # The catalogue entry (version, tensor specs, Triton model) the input was validated against: execution
    # builds requests from this snapshot, so editing or re-registering the model mid-batch cannot fail
    # the remaining lines. Null until validation planned its first shard (batches/intake/early_dispatch.py).
    model_snapshot = models.JSONField(null=True, blank=True)
    # Fencing token of validation attempts: each attempt takes the next number, and only the current one
    # may add shards or settle the batch (a redelivered or rescued validation supersedes the earlier one).
    validation_attempt = models.PositiveIntegerField(default=0, db_default=0)
    # Validation's turn (batches/intake/turns.py): when this batch's validation took its turn, null while it waits
    # for one (a batch of its tenant validating counts against VALIDATION_MAX_PER_TENANT while this is set); and when
    # a waiting message last gave its turn back, which keeps a waiting batch clear of the rescuer's deadline.
    validation_started_at = models.DateTimeField(null=True, blank=True)
    validation_waiting_at = models.DateTimeField(null=True, blank=True)
    # OpenAI's output_expires_after (anchor created_at): seconds after which the output and error files
    # expire; null keeps them until the tenant deletes them.
    output_expires_after = models.PositiveIntegerField(null=True, blank=True)
    # The W3C traceparent of the batch's create span (core/observability/tracing.py): every later stage, in whatever process,
    # opens its span under it, so the batch is one trace. Empty when tracing was off at create.
    trace_parent = models.CharField(max_length=64, blank=True, default="", db_default="")
    # The batch whose failed lines this batch re-runs (batches.rerun.batch_rerun_failed), if any.
    rerun_of = models.CharField(max_length=40, null=True, blank=True, db_index=True)
    # The error codes a re-run was asked for (null: every failed line). Its input file is built from them by
    # its validation task, which may run again after a lost message, so they are kept here, not in the message.
    rerun_error_codes = models.JSONField(null=True, blank=True)
    output_file_id = models.CharField(max_length=40, null=True, blank=True)
    error_file_id = models.CharField(max_length=40, null=True, blank=True)
    total_lines = models.PositiveBigIntegerField(default=0)
    completed_lines = models.PositiveBigIntegerField(default=0)
    failed_lines = models.PositiveBigIntegerField(default=0)
    # Tokens the model counted for the completed lines: input (prompt_tokens, of which cached_tokens came from the
    # engine's prefix cache) and, for generation, output (completion_tokens). The Batch object's ``usage``.
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    in_progress_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(db_index=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "batches"
        indexes = (models.Index(fields=["tenant", "created_at"]), models.Index(fields=["status"]))

    def __str__(self) -> str:
        return self.id


class ShardStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    # Stopped by cancel/expiry after some lines: those lines are in its part.
    STOPPED = "stopped"
    # Never ran because the batch was cancelled or expired first.
    SKIPPED = "skipped"
    # Dead letter: its content failed SHARD_MAX_ATTEMPTS times (last_error says why). At finalization
    # its lines become internal_error lines; while the batch is still open an operator can requeue it
    # (shards.shard_requeue). Infrastructure faults never lead here (see Shard.content_failures).
    DEAD = "dead"


SHARD_OPEN_STATUSES = (ShardStatus.PENDING, ShardStatus.RUNNING)


class Shard(models.Model):
    """A contiguous line range of a batch's input file, processed by one Celery task at a time.

    ``attempt`` is the fencing token: each claim increments it, and only the holder of the current
    attempt can renew the lease or commit a part. It therefore only ever grows and counts every claim,
    whatever ended it; ``content_failures`` counts the runs that failed because of the shard's own data
    (an unexpected exception while processing it), and only that is bounded by SHARD_MAX_ATTEMPTS.
    """

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="shards")
    index = models.PositiveIntegerField()
    start_line = models.PositiveBigIntegerField(help_text="1-based, inclusive")
    end_line = models.PositiveBigIntegerField(help_text="1-based, inclusive")
    start_byte = models.PositiveBigIntegerField()
    end_byte = models.PositiveBigIntegerField(help_text="exclusive")
    request_count = models.PositiveIntegerField()
    # Estimated at validation (tokens for embeddings, rows for tensors); charged to the tenant's
    # fair share at claim and corrected at commit with the measured value.
    work_units = models.PositiveBigIntegerField(default=0)
    # A pending shard is runnable once not_before has passed (deferred work waits here, in the
    # database, not as a Celery countdown).
    not_before = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=ShardStatus.choices, default=ShardStatus.PENDING)
    attempt = models.PositiveIntegerField(default=0)
    # Not a second fencing token, only a budget: Triton down or restarting, no capacity, a lost worker
    # (lease expiry) or database never add to it, so an outage costs no lines. A requeue resets it.
    content_failures = models.PositiveIntegerField(default=0)
    # Leases that ran out (the worker vanished). Not content failures, but a shard that kills every
    # worker that runs it (an OOM, a crash in a native library) would otherwise loop forever: past
    # SHARD_MAX_LEASE_EXPIRIES it goes dead like a shard whose content keeps failing.
    lease_expiries = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=200, blank=True, default="")
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    part_name = models.CharField(max_length=500, blank=True, default="")
    # The arrays validation kept of the shard's lines (kinds/tensors/columns.py); blank: the run parses its lines.
    columns_name = models.CharField(max_length=500, blank=True, default="", db_default="")
    # Lines whose envelope is valid but whose body the endpoint kind refused at validation (kinds/base.py,
    # BodyIssue): the run answers them with a 400 each and parses every line of the shard with the checked
    # parse (the unchecked fast parse is only for lines validation accepted). Not in work_units.
    body_errors = models.PositiveIntegerField(default=0, db_default=0)
    completed_lines = models.PositiveIntegerField(default=0)
    failed_lines = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    # Generation (kinds/base.TokenCounts): completion tokens, cached prompt tokens and choices of its completed lines.
    completion_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    cached_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    completion_choices = models.PositiveIntegerField(default=0, db_default=0)
    # Of the above, what ran with LoRA adapters, by the model name the lines used (`tinylm:double`): [completed,
    # prompt, completion, cached, choices] each (shards.PartSummary); null when no line named an adapter. The
    # ledger writes a row per adapter from it (usage_rows.py).
    adapter_usage = models.JSONField(null=True, blank=True)
    # The shard's lines per LoRA adapter they name (`tinylm:double` → 12), counted at validation (lines the kind
    # refused left out); null when none names one. The placement loop sums it over open shards as each adapter's
    # demand (batches/run/work_facts.py), so the scheduler's claim never reads it.
    adapter_lines = models.JSONField(null=True, blank=True)
    triton_server = models.CharField(max_length=200, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["batch", "index"], name="uniq_shard_index"),)
        indexes = (
            models.Index(fields=["status", "lease_expires_at"]),
            models.Index(fields=["batch", "status", "index"]),
        )

    def __str__(self) -> str:
        return f"{self.batch_id}#{self.index}"


class BatchEvent(models.Model):
    """Audit trail: every state change of a batch or shard writes one row, shown in the admin."""

    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="events")
    shard_index = models.PositiveIntegerField(null=True, blank=True)
    kind = models.CharField(max_length=64)
    message = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        # A list as in the migrations: a tuple would read as a changed option to makemigrations.
        ordering: ClassVar[list[str]] = ["created_at", "id"]
