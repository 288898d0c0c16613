"""The usage and cost ledger: one row per finished shard, the prices per model, and the measured fleet
capacity the compute seconds are attributed from (controlplane/usage/attribution.py).

Batches and shards are named by id, not by foreign key: the ledger is what was charged, and it outlives
the batch history that retention prunes (batches/results/retention.py)."""

from __future__ import annotations

from decimal import Decimal
from typing import ClassVar

from django.db import models
from django.utils import timezone

from controlplane.usage.rules import AMOUNT_PLACES

DEFAULT_CURRENCY = "usd"


class ComputeSource(models.TextChoices):
    # The shard's own wall time from claim to commit: the fallback until (or where) Triton's statistics
    # cover the placement the shard ran on.
    DISPATCH = "dispatch", "Shard dispatch time"
    STATISTICS = "statistics", "Triton compute statistics"


class Price(models.Model):
    """A model's price list from ``effective_from`` on; the newest one not in the future is in force."""

    model = models.ForeignKey("fleet.CatalogueModel", on_delete=models.CASCADE, related_name="prices")
    effective_from = models.DateTimeField(default=timezone.now, db_index=True)
    per_million_tokens = models.DecimalField(
        max_digits=14, decimal_places=6, default=Decimal(0), help_text="Input tokens (prompt, embeddings input)."
    )
    # Generation: cached input and output tokens have prices of their own (OpenAI's three columns); empty
    # charges them at the input price, which is what the ledger did before they existed.
    per_million_cached_tokens = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True, help_text="Input tokens served from the prefix cache."
    )
    per_million_output_tokens = models.DecimalField(
        max_digits=14, decimal_places=6, null=True, blank=True, help_text="Generated tokens."
    )
    per_thousand_rows = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal(0))
    per_gpu_second = models.DecimalField(max_digits=14, decimal_places=9, default=Decimal(0))
    currency = models.CharField(max_length=8, default=DEFAULT_CURRENCY)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["model", "effective_from"], name="uniq_price_effective"),)
        # A list as in the migrations: a tuple would read as a changed option to makemigrations.
        ordering: ClassVar[list[str]] = ["model_id", "-effective_from"]

    def __str__(self) -> str:
        return f"{self.model_id} from {self.effective_from:%Y-%m-%d %H:%M}"


class BatchOrigin(models.Model):
    """The API key that created a batch (the batch row itself does not record it)."""

    batch_id = models.CharField(max_length=40, primary_key=True)
    api_key = models.ForeignKey("tenants.ApiKey", on_delete=models.SET_NULL, null=True, related_name="+")

    def __str__(self) -> str:
        return f"{self.batch_id} by key {self.api_key_id}"


class UsageRecord(models.Model):
    """One finished shard: what ran, for whom, where, and what it cost at the price in force then."""

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="usage_records")
    api_key = models.ForeignKey("tenants.ApiKey", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    batch_id = models.CharField(max_length=40, db_index=True)
    shard_id = models.BigIntegerField(db_index=True)
    endpoint = models.CharField(max_length=64)
    model = models.CharField(max_length=200, help_text="Catalogue name, as tenants write it")
    triton_model = models.CharField(max_length=200)
    server = models.CharField(max_length=200, blank=True, default="", help_text="Triton server the shard ran on")
    completed_lines = models.PositiveIntegerField(default=0)
    failed_lines = models.PositiveIntegerField(default=0)
    tokens = models.PositiveBigIntegerField(default=0, help_text="Input tokens (embeddings, prompts)")
    # Generation: of the input tokens, those the engine's prefix cache served; and the tokens generated.
    cached_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    output_tokens = models.PositiveBigIntegerField(default=0, db_default=0)
    rows = models.PositiveBigIntegerField(default=0, help_text="Tensor rows (tensor models)")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(default=timezone.now, db_index=True)
    dispatch_seconds = models.FloatField(default=0.0)
    compute_seconds = models.FloatField(default=0.0)
    compute_source = models.CharField(max_length=16, choices=ComputeSource.choices, default=ComputeSource.DISPATCH)
    # The price in force at commit, copied: a later price change never rewrites what was charged.
    price = models.ForeignKey(Price, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    price_per_million_tokens = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal(0))
    price_per_million_cached_tokens = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    price_per_million_output_tokens = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    price_per_thousand_rows = models.DecimalField(max_digits=14, decimal_places=6, default=Decimal(0))
    price_per_gpu_second = models.DecimalField(max_digits=14, decimal_places=9, default=Decimal(0))
    currency = models.CharField(max_length=8, default=DEFAULT_CURRENCY)
    cost = models.DecimalField(max_digits=24, decimal_places=AMOUNT_PLACES, default=Decimal(0))
    # A shard that ran early, while its batch validated, for a batch that then failed validation or was
    # cancelled (batches/intake/early_dispatch.py): its lines were computed, then thrown away, but charged.
    # db_default: the last release's INSERTs during a rolling upgrade (deploy/upgrade/contract.json) name no value.
    discarded = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Ran before its batch failed validation or was cancelled: no output, charged",
    )

    class Meta:
        indexes = (
            models.Index(fields=["tenant", "finished_at"]),
            models.Index(fields=["server", "triton_model", "compute_source", "finished_at"]),
        )

    def __str__(self) -> str:
        return f"{self.batch_id} shard {self.shard_id}: {self.cost} {self.currency}"


class StatisticsCursor(models.Model):
    """The last cumulative compute time read from one model's statistics on one server."""

    server = models.CharField(max_length=200)
    triton_model = models.CharField(max_length=200)
    compute_ns = models.BigIntegerField(default=0)
    read_at = models.DateTimeField()
    # Busy time measured while no shard of this placement committed: handed to the next shards that do.
    carry_ns = models.BigIntegerField(default=0)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["server", "triton_model"], name="uniq_statistics_cursor"),)

    def __str__(self) -> str:
        return f"{self.triton_model}@{self.server}"


class CapacityInterval(models.Model):
    """One attribution interval of one placement: the instance-seconds it offered, the busy time Triton
    measured, and how much of it went to ledger rows. Idle capacity = instance-seconds - attributed."""

    server = models.CharField(max_length=200)
    triton_model = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(db_index=True)
    instances = models.PositiveIntegerField()
    instance_seconds = models.FloatField()
    busy_seconds = models.FloatField(default=0.0)
    attributed_seconds = models.FloatField(default=0.0)
    records = models.PositiveIntegerField(default=0, help_text="Ledger rows the busy time was split across")

    def __str__(self) -> str:
        return f"{self.triton_model}@{self.server} {self.started_at:%H:%M:%S}–{self.ended_at:%H:%M:%S}"
