from __future__ import annotations

from typing import ClassVar

from django.db import models
from django.utils import timezone


class ModelKind(models.TextChoices):
    EMBEDDINGS = "embeddings", "Text embeddings (/v1/embeddings)"
    TENSOR = "tensor", "Generic tensors (KServe v2 body, /v2/infer)"
    GENERATION = "generation", "Text generation (/v1/chat/completions, /v1/completions)"


class CatalogueModel(models.Model):
    """A model tenants may name in a batch, and the Triton model that serves it."""

    name = models.CharField(max_length=200, unique=True, help_text="Name tenants use in request bodies.")
    # One entry per Triton model: placement, demand and profiles are all per Triton model.
    triton_name = models.CharField(max_length=200, unique=True, help_text="Model name in the Triton repository.")
    kind = models.CharField(max_length=32, choices=ModelKind.choices)
    max_batch_size = models.PositiveIntegerField(help_text="Rows per Triton call (config.pbtxt).")
    # The served config's preferred batch size, where a tuned config has one (fleet/catalogue/tuning.py): calls are
    # packed to it so that the dynamic batcher gets the groups its shape was chosen for.
    call_rows = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Rows the control plane packs per call (the served config's largest preferred batch size); "
        "empty: max_batch_size.",
    )
    # For tensor models: [{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}] without the batch dim,
    # so a wrong input name, type or shape fails validation instead of reaching Triton.
    inputs = models.JSONField(default=list, blank=True)
    outputs = models.JSONField(default=list, blank=True)
    embedding_dimensions = models.PositiveIntegerField(null=True, blank=True)
    is_enabled = models.BooleanField(default=True)
    # Placement profile, read by the planner (fleet/placement/planner.py).
    memory_per_instance_bytes = models.PositiveBigIntegerField(default=512 * 1024**2)
    load_seconds = models.FloatField(default=10.0, help_text="Measured on the last load; declared until then")
    gpus_per_instance = models.PositiveIntegerField(default=1)
    min_instances = models.PositiveIntegerField(default=0)
    max_instances = models.PositiveIntegerField(default=4)
    # Scheduling (controlplane/scheduling/): the cap on Triton calls in flight for this model across
    # the fleet; empty means derived from ready instances (SCHEDULER_CALLS_PER_INSTANCE each).
    max_inflight_calls = models.PositiveIntegerField(null=True, blank=True)
    # The model's one speed estimate: measured shard seconds per work unit (token or row) for one dispatch
    # slot, smoothed at every commit (scheduling/claims.py); declared in the seed until the first shard
    # finishes. Work units are the unit everything else is counted in — shards are sized by them, tenants
    # charged, deadlines and queue estimates computed — and a slot's cycle is what is actually measured,
    # claim and commit included. A lines/s figure would drift with the length of the lines being served;
    # the planner derives its lines/s per instance from this at the pending work's lines per unit
    # (fleet/placement/demand.py), and the fleet-size loop uses work units directly (fleet/sizing/plans.py).
    seconds_per_work_unit = models.FloatField(default=0.0005)
    # What shards are cut by (batches/intake/validation.py): seconds per work unit with a Triton call in flight
    # (scheduling/call_clock.py), smoothed like the above. Not the cycle: its fixed costs would shrink shards
    # without end on a loaded host. 0 = not measured yet (generation streams are not): the cycle's figure is used.
    model_seconds_per_work_unit = models.FloatField(default=0.0, db_default=0.0)
    paused = models.BooleanField(default=False, help_text="No new shard of this model is dispatched.")
    pin_server = models.ForeignKey("TritonServer", on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    pin_gpus = models.JSONField(default=list, blank=True)
    last_active_at = models.DateTimeField(null=True, blank=True)
    # The pool (TritonServer.pool) whose servers the fleet-size loop adds for this model's backlog, and the only
    # servers the planner places it on.
    # db_default too: during a rolling upgrade the last release's INSERTs leave the column out (tests/deploy/
    # test_upgrade_contract.py); the same holds for the new TritonServer columns below.
    pool = models.CharField(max_length=64, default="default", db_default="default")
    # Generation models (kinds/generation/kind.py): what parsing and running a line needs. Nullable or with a
    # database default, so the last release's INSERTs still work during a rolling upgrade.
    context_length = models.PositiveIntegerField(null=True, blank=True, help_text="Tokens: prompt + completion.")
    # The Hugging Face directory whose tokenizer and chat_template the service applies (the engine gets raw
    # text): absolute, or relative to the repository root (settings.BASE_DIR).
    tokenizer_dir = models.CharField(max_length=500, blank=True, default="", db_default="")
    # Fair share charges (prompt - cached) + w x completion tokens. A decode step costs more per token than
    # prefill on GPUs (one token per forward pass against a whole prompt's worth); 1.0 until measured per
    # model (bench/generation.py is where that measurement belongs).
    completion_weight = models.FloatField(default=1.0, db_default=1.0)
    # The expected completion per choice, in tokens: the mean the engine measured over settled shards, smoothed at
    # every settle like seconds_per_work_unit (scheduling/claims.py). A line's estimate assumes
    # min(max_tokens, this); null (nothing measured yet) assumes max_tokens. Not pinned: a measurement.
    expected_completion_tokens = models.FloatField(null=True, blank=True)
    # Sequences one instance decodes at once (vLLM's max_num_seqs; tinylm's MAX_NUM_SEQS): a shard keeps twice
    # this many lines in flight, as vLLM's run_batch does, so the engine never waits for the next line.
    max_num_seqs = models.PositiveIntegerField(null=True, blank=True)
    # Whether the model's engine does constrained decoding (vLLM's `structured_outputs` sampling parameter:
    # tinylm's cb_grammar.py, vLLM's guided decoding): only then are response_format json_object / json_schema
    # lines accepted; a model without it refuses them with a 400 line.
    structured_outputs = models.BooleanField(default=False, db_default=False)
    # OpenAI's Model object has ``created``; rows older than this field get the migration's time.
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    def __str__(self) -> str:
        return self.name

    @property
    def rows_per_call(self) -> int:
        """Rows a packed call holds at most: call_rows within max_batch_size (a line of more rows still goes whole,
        up to max_batch_size, which validation enforces)."""
        return min(self.call_rows, self.max_batch_size) if self.call_rows else self.max_batch_size


ADAPTER_SEPARATOR = ":"


def split_model_name(name: str) -> tuple[str, str]:
    """A tenant's model name → (catalogue model, adapter): ``tinylm:double`` → ("tinylm", "double"), ``tinylm`` →
    ("tinylm", ""). Catalogue names never hold the separator (CatalogueAdapter.full_name relies on it)."""
    base, _, adapter = name.partition(ADAPTER_SEPARATOR)
    return base, adapter


class CatalogueAdapter(models.Model):
    """A LoRA adapter served on a generation model's engine, named by tenants ``<base>:<name>``: its lines run in
    the base's batches and engine, each sequence with its own adapter (docs/architecture/generation.md, "Adapters
    (LoRA)"). ``path`` is the adapter's folder as the engine finds it (ADAPTERS_DIR/<name> of tinylm's engine,
    multi_lora.json of vLLM's); rank and memory are what the placement planner will weigh per adapter."""

    base = models.ForeignKey(CatalogueModel, on_delete=models.CASCADE, related_name="adapters")
    name = models.SlugField(max_length=63, help_text="Tenants write <base model>:<name> in body.model.")
    path = models.CharField(
        max_length=500,
        blank=True,
        default="",
        help_text="The adapter's PEFT folder, relative to the base's model folder",
    )
    rank = models.PositiveIntegerField(default=8, help_text="LoRA rank r (vLLM's max_lora_rank must cover it)")
    is_enabled = models.BooleanField(default=True)
    memory_bytes = models.PositiveBigIntegerField(default=0, help_text="Weights held per loaded copy (declared)")
    # Touched whenever the adapter's lines wait or run (fleet/placement/demand.py): the residency plan unloads the
    # least recently used demandless adapter first when an instance needs the slot.
    last_active_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["base", "name"], name="uniq_adapter_per_base"),)
        ordering: ClassVar[list[str]] = ["base_id", "name"]

    @property
    def full_name(self) -> str:
        return f"{self.base.name}{ADAPTER_SEPARATOR}{self.name}"

    def __str__(self) -> str:
        return self.full_name


class ServerState(models.TextChoices):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"
    CORDONED = "cordoned"


class TritonServer(models.Model):
    """A Triton process the control plane places models on and sends shards to."""

    name = models.CharField(max_length=100, unique=True)
    grpc_url = models.CharField(max_length=200, unique=True, help_text="host:port of Triton's gRPC endpoint")
    metrics_url = models.CharField(max_length=300, blank=True, default="")
    http_url = models.CharField(
        max_length=300, blank=True, default="", db_default="", help_text="http://host:port of Triton's HTTP endpoint"
    )
    # One kind of GPU node: the fleet-size loop (fleet/sizing/planner.py) plans servers per pool.
    pool = models.CharField(max_length=64, default="default", db_default="default", db_index=True)
    # Declared GPUs (CPU hosts, tests) run instances as KIND_CPU; real ones as KIND_GPU with gpu ids.
    real_gpus = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=ServerState.choices, default=ServerState.HEALTHY)
    # Operators set draining/cordoned; the heartbeat only moves servers between healthy and unhealthy.
    operator_state = models.CharField(max_length=16, choices=ServerState.choices, null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # Liveness and the call breaker count apart: failed Triton calls under load must not make one missed
    # heartbeat mark a live server unhealthy (its placements dropped), nor a heartbeat reset the breaker's count.
    missed_heartbeats = models.PositiveIntegerField(default=0, db_default=0)
    consecutive_failures = models.PositiveIntegerField(default=0)  # failed calls in a row (the circuit breaker)
    breaker_open_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    server = models.ForeignKey(TritonServer, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveIntegerField()
    name = models.CharField(max_length=100, default="declared")
    total_memory_bytes = models.PositiveBigIntegerField()
    used_by_others_bytes = models.PositiveBigIntegerField(default=0)
    utilization = models.FloatField(null=True, blank=True)
    declared = models.BooleanField(default=True, help_text="Declared in configuration rather than measured")

    class Meta:
        constraints = (models.UniqueConstraint(fields=["server", "index"], name="uniq_gpu_index"),)
        # A list as in the migrations: a tuple would read as a changed option to makemigrations.
        ordering: ClassVar[list[str]] = ["server_id", "index"]

    def __str__(self) -> str:
        return f"{self.server.name}/gpu{self.index}"


class PlacementStatus(models.TextChoices):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


def gpus_text(gpus: tuple[int, ...]) -> str:
    """A planner's GPU set as a Placement row's ``gpus``."""
    return ",".join(str(g) for g in gpus)


def gpus_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(g) for g in text.split(",") if g != "")


class Placement(models.Model):
    """Instances of one model on one server's GPU set, as the reconciler last applied them."""

    model = models.ForeignKey(CatalogueModel, on_delete=models.CASCADE, related_name="placements")
    server = models.ForeignKey(TritonServer, on_delete=models.CASCADE, related_name="placements")
    gpus = models.CharField(max_length=64, help_text="Comma-separated GPU indices of this instance group")
    instances = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=PlacementStatus.choices, default=PlacementStatus.LOADING)
    failed_until = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    # Loads that failed here in a row (fleet/placement/reconciler.py: the backoff doubles with each); 0 after a good one.
    load_failures = models.PositiveIntegerField(default=0, db_default=0)
    # Triton's own view, from its statistics API (averages since the model was loaded there).
    avg_queue_ms = models.FloatField(null=True, blank=True)
    avg_compute_ms = models.FloatField(null=True, blank=True)
    # Bytes one instance holds on each of its GPUs as Triton's statistics report it (fleet/placement/memory.py); null
    # where nothing reports GPU memory (CPU hosts): the planner then uses the model's declared figure.
    measured_memory_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = (models.UniqueConstraint(fields=["model", "server", "gpus"], name="uniq_placement"),)

    def __str__(self) -> str:
        return f"{self.model.triton_name}@{self.server.name} x{self.instances}"


class FleetLock(models.Model):
    """A lease row so only one reconciler runs at a time (works on Postgres and SQLite alike)."""

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=200, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)


class PlacementEvent(models.Model):
    """Every placement change with who/why/when, shown in the admin."""

    model = models.ForeignKey(CatalogueModel, on_delete=models.SET_NULL, null=True, related_name="+")
    server = models.ForeignKey(TritonServer, on_delete=models.SET_NULL, null=True, related_name="+")
    gpus = models.CharField(max_length=64, blank=True, default="")
    action = models.CharField(max_length=32)
    before = models.PositiveIntegerField(default=0)
    after = models.PositiveIntegerField(default=0)
    reason = models.TextField(blank=True, default="")
    actor = models.CharField(max_length=100, default="reconciler")
    ok = models.BooleanField(default=True)
    # A consolidation move (action consolidate / move_in / move_out): the model it makes room for.
    move_for = models.CharField(max_length=200, blank=True, default="", db_default="")  # db_default: rolling upgrade
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        # A list as in the migrations: a tuple would read as a changed option to makemigrations.
        ordering: ClassVar[list[str]] = ["-created_at", "-id"]


class FleetSizePlan(models.Model):
    """The latest fleet-size plan of one pool (fleet/sizing/planner.py), written by the ``fleet.size_plan`` beat task.

    ``desired_workers`` is fleet-wide (the same on every row); ``inputs`` holds what the answer came from
    and the planner's memory (``below_since``, the start of the scale-down cooldown)."""

    pool = models.CharField(max_length=64, unique=True)
    desired_servers = models.PositiveIntegerField()
    desired_workers = models.PositiveIntegerField()
    inputs = models.JSONField(default=dict)
    computed_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.pool}: {self.desired_servers} server(s)"
