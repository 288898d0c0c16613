"""Settings of batches and files: product limits, idempotency, shards and their leases, housekeeping, and the
data lifecycle (docs/architecture/data-lifecycle.md). The beat entries of the intervals are in __init__.py."""

from __future__ import annotations

from controlplane.core.env import env_bool, env_float, env_int, env_list

# --- Product limits -------------------------------------------------------------------------------
# 1 GiB, as OpenAI's batch limit.
FILE_MAX_BYTES = env_int("FILE_MAX_BYTES", 1024**3, minimum=1, help="Largest file a tenant may upload (413 above).")
BATCH_MAX_LINE_BYTES = env_int(
    "BATCH_MAX_LINE_BYTES", 1024 * 1024, minimum=1, help="Longest line of a batch's input file."
)
API_MAX_JSON_BYTES = env_int(
    "API_MAX_JSON_BYTES", 1024 * 1024, minimum=1, help="Largest JSON request body (413 above)."
)
BATCH_MAX_LINES = env_int("BATCH_MAX_LINES", 5_000_000, minimum=1, help="Most requests (lines) in one batch.")
# A generation line's output bound, n x max_tokens x (with logprobs) 2 + top_logprobs entries per token
# (kinds/generation/bodies.py): 131,072 is ~6 MB of JSON, and leaves n 1 at 128k tokens or n 8 at 16k plain.
GENERATION_MAX_LINE_OUTPUT_UNITS = env_int(
    "GENERATION_MAX_LINE_OUTPUT_UNITS",
    131_072,
    minimum=1,
    help="Most output one generation line may ask for (n x max_tokens x logprob entries per token); above: a 400 line.",
)
# Answers arrive whole (unstreamed) and wait in the shard run's inbox: 256 MiB bounds a worker thread's share at
# ~25 lines of the largest output GENERATION_MAX_LINE_OUTPUT_UNITS allows, far above ordinary lines' needs.
GENERATION_INFLIGHT_OUTPUT_BYTES = env_int(
    "GENERATION_INFLIGHT_OUTPUT_BYTES",
    256 * 1024 * 1024,
    minimum=1,
    help="Most output (estimated at max_tokens) a shard run's generation lines in flight may write; past it, "
    "lines wait until others finish (at least one is always in flight).",
)
# Idempotency-Key on POST /v1/files and /v1/batches (core/http/idempotency.py); a key lives 24 h, as at OpenAI and Stripe.
IDEMPOTENCY_KEY_TTL_SECONDS = env_int(
    "IDEMPOTENCY_KEY_TTL_SECONDS", 24 * 3600, minimum=1, help="How long an Idempotency-Key's answer is replayed."
)
IDEMPOTENCY_WAIT_SECONDS = env_float(
    "IDEMPOTENCY_WAIT_SECONDS", 10.0, help="A request's wait on a same-key request in progress before a retryable 409."
)
IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS = env_int(
    "IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS",
    900,
    minimum=1,
    help="Age at which an unanswered key's claim is taken over (SQLite).",
)
IDEMPOTENCY_PRUNE_INTERVAL_SECONDS = env_int(
    "IDEMPOTENCY_PRUNE_INTERVAL_SECONDS", 3600, minimum=1, help="How often beat deletes expired idempotency keys."
)
OUTBOX_RELAY_INTERVAL_SECONDS = env_float(
    "OUTBOX_RELAY_INTERVAL_SECONDS", 1.0, help="How often beat retries the outbox's messages whose send failed."
)
# Shards run while the rest of their file is validated, invisible until it is valid (batches/intake/early_dispatch.py);
# tensor shards run from the arrays validation kept of their lines, not from their JSON (kinds/tensors/columns.py).
BATCH_EARLY_DISPATCH = env_bool(
    "BATCH_EARLY_DISPATCH", True, help="Shards run while the rest of their input file is still being validated."
)
# Two of the local stack's four shard-worker processes: a newcomer's shard finds one free (scheduling/selectors.py).
BATCH_EARLY_DISPATCH_MAX_RUNNING = env_int(
    "BATCH_EARLY_DISPATCH_MAX_RUNNING",
    2,
    minimum=1,
    help="Shards of one batch that run at once while the rest of its file is still being validated.",
)
BATCH_SHARD_COLUMNS = env_bool(
    "BATCH_SHARD_COLUMNS", True, help="Tensor shards run from the arrays validation kept, not from their JSON lines."
)

# --- Shards ---------------------------------------------------------------------------------------
# Bounds on a shard, which is sized by time (SCHEDULER_SHARD_SECONDS) below them. Cheap rows hit the line
# bound: 4,096 identity lines/shard ran 43k lines/s end to end vs 29k at 1,024 with a newcomer's slowdown
# behind a flood 1.42× (8,192: 46k but 2.56×; docs/performance.md). Bytes bound a worker's memory per shard.
SHARD_MAX_LINES = env_int("SHARD_MAX_LINES", 4096, minimum=1, help="Most lines in one shard.")
SHARD_MAX_BYTES = env_int("SHARD_MAX_BYTES", 16 * 1024**2, minimum=1, help="Most input bytes in one shard.")
# A running shard's lease is renewed every second by a keeper thread for the whole run (reading, model
# load, calls, writing the part), so its length does not depend on how long a shard takes: it only has to
# outlast a few missed renewals (a GC pause, a slow database). 10 s plus a rescue every 2 s runs a killed
# worker's shards again within ~12-15 s (a 60 s lease and a 10 s rescue made three killed workers cost a
# batch 60 s).
SHARD_LEASE_SECONDS = env_int(
    "SHARD_LEASE_SECONDS", 10, minimum=1, help="A running shard's lease; a lost worker's shards run again after it."
)
# Infrastructure faults (Triton down, no capacity, a lost worker) never count (Shard.content_failures).
SHARD_MAX_ATTEMPTS = env_int(
    "SHARD_MAX_ATTEMPTS", 5, minimum=1, help="Runs failed by a shard's own content before it is a dead letter."
)
# High, because a lost worker is normally not the shard's fault (a deploy, a node drain, an outage of the
# database that stopped renewals); eight in a row on the same shard means the shard itself kills workers (OOM,
# a crash in native code).
SHARD_MAX_LEASE_EXPIRIES = env_int(
    "SHARD_MAX_LEASE_EXPIRIES", 8, minimum=1, help="Lost leases of one shard before it is a dead letter."
)
# The rescuer is one indexed query on (status, lease_expires_at): cheap enough to run every 2 s.
RESCUE_INTERVAL_SECONDS = env_float(
    "RESCUE_INTERVAL_SECONDS", 2.0, help="How often beat hands shards whose lease expired to another worker."
)
# A batch still in validating this long after its validation took its turn (or was re-enqueued, or last gave its
# turn back) lost its message or its worker: the rescuer enqueues it again (validation checks the status first, so a
# duplicate is harmless) and fails it after validation_rescue.VALIDATION_MAX_ATTEMPTS tries. The running attempt
# stops itself a little before this deadline (batches/intake/validation_deadline.py), so a validation that is still
# running is never duplicated. Finalization is idempotent, so a stale finalizer is simply replaced.
BATCH_VALIDATION_DEADLINE_SECONDS = env_int(
    "BATCH_VALIDATION_DEADLINE_SECONDS",
    1200,
    minimum=1,
    help="A batch still validating this long after its validation took its turn is enqueued again.",
)
# One, with the validation worker's two processes: a tenant's flood of large files holds one process, and every
# other tenant's validation finds the other (batches/intake/turns.py).
VALIDATION_MAX_PER_TENANT = env_int(
    "VALIDATION_MAX_PER_TENANT",
    1,
    minimum=1,
    help="Most batches of one tenant validating at once; another waits for its turn behind other tenants' work.",
)
FINALIZE_STALE_SECONDS = env_int(
    "FINALIZE_STALE_SECONDS", 600, minimum=1, help="A finalizer still finalizing after this is presumed dead."
)
# Beat's jobs and finalize run on thread pools, which ignore Celery's time limits: each run stops by this deadline
# (its statements' timeout and its loops' budget, core/workers/deadlines.py) and the next run continues. Two
# minutes: every job's run is bounded by count far below it (history_prune: at most 100,000 rows of a kind).
JOB_DEADLINE_SECONDS = env_int(
    "JOB_DEADLINE_SECONDS",
    120,
    minimum=1,
    help="Most seconds one run of a beat job or finalize may take; its next run continues.",
)
EXPIRY_INTERVAL_SECONDS = env_float(
    "EXPIRY_INTERVAL_SECONDS", 30.0, help="How often beat expires batches past their completion window."
)
# Several packed calls in flight keep Triton's dynamic batcher fed while one call's result travels back.
DISPATCH_INFLIGHT_CALLS = env_int(
    "DISPATCH_INFLIGHT_CALLS", 3, minimum=1, help="Packed Triton calls a running shard keeps in flight."
)
# OpenAI accepts only 24h; shorter windows exist for tests and demos.
BATCH_COMPLETION_WINDOWS = env_list(
    "BATCH_COMPLETION_WINDOWS", ["24h"], help="The completion windows a batch may ask for."
)

# --- Data lifecycle -------------------------------------------------------------------------------
# The storage quota covers bytes of stored files, uploads and results, and the expected results of running
# batches (files/quota.py). Over it an upload is a 413 (the file alone is larger) or a 429, a batch fails
# validation. 100 GiB: OpenAI's per-organization file storage, so a tenant that fits there fits here.
TENANT_STORAGE_QUOTA_BYTES = env_int(
    "TENANT_STORAGE_QUOTA_BYTES",
    100 * 1024**3,
    minimum=0,
    help="Storage quota of every tenant without its own (the admin sets one per tenant); 0: unlimited.",
)
# Estimated by kinds/base.EndpointKind.output_bytes_estimate: a result file is written whole by one finalizer,
# and downloaded whole.
BATCH_MAX_OUTPUT_BYTES = env_int(
    "BATCH_MAX_OUTPUT_BYTES",
    20 * 1024**3,
    minimum=1,
    help="A batch whose expected results are larger fails validation (output_too_large).",
)
FILE_EXPIRY_INTERVAL_SECONDS = env_float(
    "FILE_EXPIRY_INTERVAL_SECONDS", 300.0, help="How often beat deletes files past their expires_at."
)
BATCH_RETENTION_DAYS = env_int(
    "BATCH_RETENTION_DAYS",
    30,
    minimum=1,
    help="Events and shard rows of batches that ended this many days ago are pruned (the batch row stays).",
)
BATCH_RETENTION_INTERVAL_SECONDS = env_float(
    "BATCH_RETENTION_INTERVAL_SECONDS", 3600.0, help="How often beat prunes the history of ended batches."
)
# It must outlast the longest gap between a blob's write and its row's commit (an upload's row, a finalizer
# storing its error file after its output file): an hour is far above both.
STORAGE_GC_GRACE_SECONDS = env_int(
    "STORAGE_GC_GRACE_SECONDS",
    3600,
    minimum=60,
    help="Age after which the storage collector deletes ended batches' part blobs and blobs no row refers to.",
)
STORAGE_GC_INTERVAL_SECONDS = env_float(
    "STORAGE_GC_INTERVAL_SECONDS", 600.0, help="How often beat runs the storage collector."
)
STORAGE_GC_SCAN_LIMIT = env_int(
    "STORAGE_GC_SCAN_LIMIT",
    10_000,
    minimum=1,
    help="Blobs one collector run looks at (a listing and a row lookup each); the next run starts elsewhere.",
)
