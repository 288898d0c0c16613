"""Django settings (DJANGO_SETTINGS_MODULE=controlplane.settings): this module and one module per concern
beside it (paths, storage, openapi, fleet, webhooks, usage, console), whose values it imports. Apps read
every value as ``django.conf.settings.X``, never from these modules.

Every value comes from the environment through controlplane.core.env, with embedded defaults that run
the whole service on one machine with no services (SQLite, kombu's filesystem broker, local storage).
Production sets DATABASE_URL, CELERY_BROKER_URL and storage variables; see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dj_database_url

from controlplane.core import fs_broker, logs, queues
from controlplane.core.env import (
    SECRET_KEY_FILENAME,
    env_bool,
    env_choice,
    env_float,
    env_int,
    env_list,
    env_pair,
    env_secret_key,
    env_str,
)
from controlplane.settings.console import *  # noqa: F403
from controlplane.settings.console import CONSOLE_SAMPLES_INTERVAL_SECONDS
from controlplane.settings.fleet import *  # noqa: F403
from controlplane.settings.fleet import (
    FLEET_HEARTBEAT_INTERVAL_SECONDS,
    FLEET_RECONCILE_INTERVAL_SECONDS,
    FLEET_SCALING,
)
from controlplane.settings.openapi import SPECTACULAR_SETTINGS as SPECTACULAR_SETTINGS
from controlplane.settings.paths import BASE_DIR as BASE_DIR
from controlplane.settings.paths import VAR_DIR as VAR_DIR
from controlplane.settings.storage import *  # noqa: F403
from controlplane.settings.tracing import *  # noqa: F403
from controlplane.settings.usage import *  # noqa: F403
from controlplane.settings.usage import USAGE_ATTRIBUTION_INTERVAL_SECONDS
from controlplane.settings.webhooks import *  # noqa: F403
from controlplane.settings.webhooks import WEBHOOK_SWEEP_INTERVAL_SECONDS

DEBUG = env_bool("DJANGO_DEBUG", False)
# DJANGO_SECRET_KEY, else the local runner's generated var/secret_key; the public embedded key only with
# DEBUG. Anything else stops every process at start-up (core/env.py, env_secret_key, says why).
SECRET_KEY = env_secret_key("DJANGO_SECRET_KEY", key_file=VAR_DIR / SECRET_KEY_FILENAME, debug=DEBUG)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",  # the tenant API's OpenAPI schema (/v1/openapi.json) and Swagger UI (/v1/docs)
    "drf_spectacular_sidecar",  # Swagger UI's JS/CSS as static files: the docs page needs no CDN
    "controlplane.core",
    "controlplane.tenants",
    "controlplane.files",
    "controlplane.fleet",
    "controlplane.batches",
    "controlplane.scheduling",
    "controlplane.webhooks",
    "controlplane.usage",
    "controlplane.console",  # dashboards, roles, audit log of admin actions
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "controlplane.core.request_log.RequestLogMiddleware",  # request id + batch id on every log line (logs.py)
    "controlplane.core.middleware.RejectNulMiddleware",  # ?after=%00 is a 400, not a Postgres error
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "controlplane.console.login_throttle.AdminLoginThrottleMiddleware",  # failed admin logins per user and address
    "django.contrib.messages.middleware.MessageMiddleware",
    # x-ratelimit-*-requests headers on every API response, like OpenAI's (tenants/auth.py counts).
    "controlplane.tenants.middleware.RateLimitHeadersMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# --- HTTP security (README, "Production settings"; `manage.py check --deploy` passes with those) ---------
# Off by default because the embedded default serves plain http on 127.0.0.1; production terminates TLS
# (usually at a proxy that sets X-Forwarded-Proto) and turns these on.
X_FRAME_OPTIONS = "DENY"  # the admin is never framed (clickjacking)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", False)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Reached inside the cluster or host over plain http, without the proxy's X-Forwarded-Proto: liveness probes,
# Prometheus's scrape, and the Triton fleet agent's registration and drain (bearer tokens, never a browser).
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$", r"^internal/"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
# e.g. "HTTP_X_FORWARDED_PROTO,https": only behind a proxy that always sets (overwrites) that header.
SECURE_PROXY_SSL_HEADER = env_pair("SECURE_PROXY_SSL_HEADER")
# The admin's POSTs behind a TLS proxy on another origin, e.g. "https://batch.example.com".
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

ROOT_URLCONF = "controlplane.urls"
WSGI_APPLICATION = "controlplane.wsgi.application"
APPEND_SLASH = False

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_SQLITE_URL = f"sqlite:///{VAR_DIR / 'db.sqlite3'}"
# Health checks: a persistent connection is verified before its first use in each request or task, so
# a restarted Postgres costs no 500 and no failed task (tests/chaos: one 500 per stale connection without).
DATABASES = {
    "default": dj_database_url.parse(env_str("DATABASE_URL", _SQLITE_URL), conn_max_age=60, conn_health_checks=True)
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Web, worker and beat share one SQLite file: WAL lets readers run beside the one writer, and
    # IMMEDIATE transactions take the write lock up front instead of failing on lock upgrade.
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
# The test database is named after the configured one, so test runs against different databases (checkouts side
# by side, CI beside a developer) never drop each other's; pytest-xdist adds a per-worker suffix to it.
DATABASES["default"]["TEST"] = {
    "NAME": env_str(
        "DATABASE_TEST_NAME",
        "test_controlplane"
        if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
        else f"test_{DATABASES['default']['NAME']}",
    )
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
SERVE_STATIC = env_bool("SERVE_STATIC", True)
STATIC_ROOT = VAR_DIR / "static"

# Storage (MEDIA_ROOT, STORAGES, upload spooling): storage.py.

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["controlplane.tenants.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.tenants.auth.IsTenant"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only (API_MAX_JSON_BYTES, no 500 on hostile JSON). Multipart is parsed by POST /v1/files alone
    # (files/views.py), under FILE_MAX_BYTES and the storage quota: a global multipart parser let any endpoint
    # spool a body of any size to a temporary file before its 400. Anything else is a 415, unread.
    "DEFAULT_PARSER_CLASSES": ["controlplane.core.parsers.LimitedJSONParser"],
    "EXCEPTION_HANDLER": "controlplane.core.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # `?format=` is no API parameter: DRF would answer `?format=csv` on any endpoint with a 404.
    "URL_FORMAT_OVERRIDE": None,
}

# --- Product limits -------------------------------------------------------------------------------
FILE_MAX_BYTES = env_int("FILE_MAX_BYTES", 1024**3, minimum=1)  # 1 GiB, as OpenAI's batch limit
BATCH_MAX_LINE_BYTES = env_int("BATCH_MAX_LINE_BYTES", 1024 * 1024, minimum=1)
API_MAX_JSON_BYTES = env_int("API_MAX_JSON_BYTES", 1024 * 1024, minimum=1)  # JSON request bodies (413 above)
BATCH_MAX_LINES = env_int("BATCH_MAX_LINES", 5_000_000, minimum=1)
# Idempotency-Key on POST /v1/files and /v1/batches (core/idempotency.py): a key's lifetime (OpenAI, Stripe: 24 h),
# a same-key request's wait before a retryable 409, the age at which an unanswered SQLite claim is taken over.
IDEMPOTENCY_KEY_TTL_SECONDS = env_int("IDEMPOTENCY_KEY_TTL_SECONDS", 24 * 3600, minimum=1)
IDEMPOTENCY_WAIT_SECONDS = env_float("IDEMPOTENCY_WAIT_SECONDS", 10.0)
IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS = env_int("IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS", 900, minimum=1)
IDEMPOTENCY_PRUNE_INTERVAL_SECONDS = env_int("IDEMPOTENCY_PRUNE_INTERVAL_SECONDS", 3600, minimum=1)
OUTBOX_RELAY_INTERVAL_SECONDS = env_float("OUTBOX_RELAY_INTERVAL_SECONDS", 1.0)  # retry of a failed send
# Shards run while the rest of their file is validated, invisible until it is valid (batches/intake/early_dispatch.py);
# tensor shards run from the arrays validation kept of their lines, not from their JSON (kinds/tensor_columns.py).
BATCH_EARLY_DISPATCH = env_bool("BATCH_EARLY_DISPATCH", True)
BATCH_SHARD_COLUMNS = env_bool("BATCH_SHARD_COLUMNS", True)
# Bounds on a shard, which is sized by time (SCHEDULER_SHARD_SECONDS) below them. Cheap rows hit the line
# bound: 4,096 identity lines/shard ran 43k lines/s end to end vs 29k at 1,024 with a newcomer's slowdown
# behind a flood 1.42× (8,192: 46k but 2.56×; docs/PERFORMANCE.md). Bytes bound a worker's memory per shard.
SHARD_MAX_LINES = env_int("SHARD_MAX_LINES", 4096, minimum=1)
SHARD_MAX_BYTES = env_int("SHARD_MAX_BYTES", 16 * 1024**2, minimum=1)
# A running shard's lease is renewed every second by a keeper thread for the whole run (reading, model
# load, calls, writing the part), so its length does not depend on how long a shard takes: it only has to
# outlast a few missed renewals (a GC pause, a slow database). 10 s plus a rescue every 2 s runs a killed
# worker's shards again within ~12-15 s (it was 60 s + 10 s: three SIGKILLs cost a batch 60 s).
SHARD_LEASE_SECONDS = env_int("SHARD_LEASE_SECONDS", 10, minimum=1)
# Runs of a shard that failed because of its own content before it becomes a dead letter; infrastructure
# faults (Triton down, no capacity, a lost worker) never count (Shard.content_failures).
SHARD_MAX_ATTEMPTS = env_int("SHARD_MAX_ATTEMPTS", 5, minimum=1)
# Lost leases of one shard before it is a dead letter. High, because a lost worker is normally not the
# shard's fault (a deploy, a node drain, an outage of the database that stopped renewals); eight in a row
# on the same shard means the shard itself kills workers (OOM, a crash in native code).
SHARD_MAX_LEASE_EXPIRIES = env_int("SHARD_MAX_LEASE_EXPIRIES", 8, minimum=1)
# The rescuer is one indexed query on (status, lease_expires_at): cheap enough to run every 2 s.
RESCUE_INTERVAL_SECONDS = env_float("RESCUE_INTERVAL_SECONDS", 2.0)
# A batch still in validating this long after its validation was (re)enqueued lost its message or its
# worker: the rescuer enqueues it again (validation checks the status first, so a duplicate is harmless) and
# fails it after validation_rescue.VALIDATION_MAX_ATTEMPTS tries. The running attempt stops itself a little
# before this deadline (batches/intake/validation_deadline.py; the control worker's thread pool ignores Celery's time
# limits), so a validation that is still running is never duplicated. A finalizer still finalizing after
# FINALIZE_STALE_SECONDS is presumed dead and another one starts (finalization is idempotent).
BATCH_VALIDATION_DEADLINE_SECONDS = env_int("BATCH_VALIDATION_DEADLINE_SECONDS", 1200, minimum=1)
FINALIZE_STALE_SECONDS = env_int("FINALIZE_STALE_SECONDS", 600, minimum=1)
EXPIRY_INTERVAL_SECONDS = env_float("EXPIRY_INTERVAL_SECONDS", 30.0)
# Several packed calls in flight keep Triton's dynamic batcher fed while one call's result travels back.
DISPATCH_INFLIGHT_CALLS = env_int("DISPATCH_INFLIGHT_CALLS", 3, minimum=1)
# Shortest completion window accepted; OpenAI accepts only 24h, shorter ones exist for tests and demos.
BATCH_COMPLETION_WINDOWS = env_list("BATCH_COMPLETION_WINDOWS", ["24h"])

# --- Data lifecycle (docs/ARCHITECTURE.md, "Data lifecycle") ---------------------------------------
# The storage quota of every tenant without its own (the admin sets one per tenant): bytes of stored files,
# uploads and results, and the expected results of running batches (files/quota.py). Over it an upload is a 413
# (the file alone is larger) or a 429, a batch fails validation. 0: unlimited. 100 GiB: OpenAI's per-organization
# file storage, so a tenant that fits there fits here.
TENANT_STORAGE_QUOTA_BYTES = env_int("TENANT_STORAGE_QUOTA_BYTES", 100 * 1024**3, minimum=0)
# A batch whose expected results (kinds/base.EndpointKind.output_bytes_estimate) are larger fails validation
# (output_too_large): a result file is written whole by one finalizer, and downloaded whole.
BATCH_MAX_OUTPUT_BYTES = env_int("BATCH_MAX_OUTPUT_BYTES", 20 * 1024**3, minimum=1)
# How often beat deletes files past their expires_at (expires_after, output_expires_after).
FILE_EXPIRY_INTERVAL_SECONDS = env_float("FILE_EXPIRY_INTERVAL_SECONDS", 300.0)
# Events and shard rows of batches that ended this many days ago are pruned (the Batch row stays).
BATCH_RETENTION_DAYS = env_int("BATCH_RETENTION_DAYS", 30, minimum=1)
BATCH_RETENTION_INTERVAL_SECONDS = env_float("BATCH_RETENTION_INTERVAL_SECONDS", 3600.0)
# The storage collector deletes part blobs of batches that ended this long ago, and blobs no row refers to
# once they are this old. It must outlast the longest gap between a blob's write and its row's commit (an
# upload's row, a finalizer storing its error file after its output file): an hour is far above both.
STORAGE_GC_GRACE_SECONDS = env_int("STORAGE_GC_GRACE_SECONDS", 3600, minimum=60)
STORAGE_GC_INTERVAL_SECONDS = env_float("STORAGE_GC_INTERVAL_SECONDS", 600.0)
# Blobs one collector run looks at (a listing and a row lookup each); the next run starts elsewhere.
STORAGE_GC_SCAN_LIMIT = env_int("STORAGE_GC_SCAN_LIMIT", 10_000, minimum=1)

# --- Scheduling (docs/ARCHITECTURE.md, "Scheduling") -------------------------------------------
# "fair": priority classes, weighted fair share, deadlines. "fifo": oldest first (the fairness bench's baseline).
SCHEDULER_POLICY = env_choice("SCHEDULER_POLICY", "fair", ("fair", "fifo"))
# A running shard cannot be preempted, so a newcomer waits at most about one shard per slot: shards
# are cut to this much measured model time (0.25–1 s keeps per-shard overhead small and waits short).
# 1 s, the top of that range: measured on MiniLM (CPU), 0.5 s shards of ~10 lines made the 100-line batch
# 2.6 s instead of 1.9 s (calls too small to batch); tensor floods hit SHARD_MAX_LINES first anyway.
SCHEDULER_SHARD_SECONDS = env_float("SCHEDULER_SHARD_SECONDS", 1.0)
SCHEDULER_SHARD_MIN_LINES = env_int("SCHEDULER_SHARD_MIN_LINES", 4, minimum=1)
# A normal or low batch not served for this long is served before every class (bounded wait).
SCHEDULER_AGING_SECONDS = env_float("SCHEDULER_AGING_SECONDS", 600.0)
# Usage half-life of the fair share: a tenant's lead over others is forgotten at this pace.
SCHEDULER_HALF_LIFE_SECONDS = env_float("SCHEDULER_HALF_LIFE_SECONDS", 3600.0)
# A batch whose remaining work needs more than this fraction of its time left is promoted.
SCHEDULER_DEADLINE_FRACTION = env_float("SCHEDULER_DEADLINE_FRACTION", 0.5)
# Default cap on Triton calls in flight per ready instance (a model's max_inflight_calls overrides):
# two shards of DISPATCH_INFLIGHT_CALLS calls keep an instance's dynamic batcher fed.
SCHEDULER_CALLS_PER_INSTANCE = env_int("SCHEDULER_CALLS_PER_INSTANCE", 6, minimum=1)
# A queued slot whose message was lost (or taken by a worker that died before starting it) stops
# counting against the cap after this. Short is safe: a message that arrives after its slot expired
# does nothing, so an early expiry costs one extra message, never an extra shard in flight.
SCHEDULER_SLOT_QUEUED_SECONDS = env_float("SCHEDULER_SLOT_QUEUED_SECONDS", 20.0)
# A slot runs shards back to back for at most this long, then hands its place back to the broker
# (behind other models' slots), so one model's backlog never holds every worker thread.
SCHEDULER_SLOT_BUDGET_SECONDS = env_float("SCHEDULER_SLOT_BUDGET_SECONDS", 10.0)
# How often beat tops up every model's slots (the other top-ups are event-driven).
SCHEDULER_TOPUP_INTERVAL_SECONDS = env_float("SCHEDULER_TOPUP_INTERVAL_SECONDS", 2.0)

# Webhooks: webhooks.py. Triton, placement and the fleet size (FLEET_SCALING): fleet.py.

# --- Celery ---------------------------------------------------------------------------------------
_broker_dir = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport, whose message files are never read half-written (core/fs_broker.py).
    CELERY_BROKER_TRANSPORT = fs_broker.TRANSPORT
    CELERY_BROKER_TRANSPORT_OPTIONS = fs_broker.transport_options(_broker_dir)
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Redis re-delivers an unacked task only after this; the shard rescuer is the faster path, so
        # this is a backstop that must exceed the longest shard.
        "visibility_timeout": 3600,
    }
    # Stacks that share one Redis database stay apart by key prefix (test runs side by side, several
    # deployments on one Redis): each sees only its own queues and unacked messages.
    if _broker_key_prefix := env_str("CELERY_BROKER_KEY_PREFIX", ""):
        CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = _broker_key_prefix
CELERY_TASK_IGNORE_RESULT = True
# Celery's Django fixup closes every database connection before and after each task unless this is set, so each
# task (a beat tick: ~4 a second) opened a new Postgres connection, a backend fork. Set, a task keeps its thread's
# connection as a request does: Django's own rules decide before and after each task (CONN_MAX_AGE, the health
# check, a connection left in error; core/database.py, connections_tidy). The fixup still closes them after
# this many tasks of a process, a bound on nothing that matters here.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 900)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 960)
CELERY_TASK_DEFAULT_QUEUE = queues.DEFAULT_QUEUE
CELERY_TASK_ROUTES = {task: {"queue": queue} for task, queue in queues.TASK_QUEUES.items()}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "rescue-expired-leases": {
        "task": "batches.shards_rescue",
        "schedule": timedelta(seconds=RESCUE_INTERVAL_SECONDS),
    },
    "expire-batches": {
        "task": "batches.batches_expire",
        "schedule": timedelta(seconds=EXPIRY_INTERVAL_SECONDS),
    },
    "slots-topup": {
        "task": "scheduling.slots_topup",
        "schedule": timedelta(seconds=SCHEDULER_TOPUP_INTERVAL_SECONDS),
    },
    "fleet-heartbeat": {
        "task": "fleet.heartbeat",
        "schedule": timedelta(seconds=FLEET_HEARTBEAT_INTERVAL_SECONDS),
    },
    "fleet-reconcile": {
        "task": "fleet.reconcile",
        "schedule": timedelta(seconds=FLEET_RECONCILE_INTERVAL_SECONDS),
    },
    "fleet-size-plan": {  # every FLEET_SIZE_INTERVAL_SECONDS
        "task": "fleet.size_plan",
        "schedule": timedelta(seconds=FLEET_SCALING.interval_s),
    },
    "outbox-relay": {
        "task": "core.outbox_relay",
        "schedule": timedelta(seconds=OUTBOX_RELAY_INTERVAL_SECONDS),
    },
    "prune-idempotency-keys": {
        "task": "core.idempotency_records_prune",
        "schedule": timedelta(seconds=IDEMPOTENCY_PRUNE_INTERVAL_SECONDS),
    },
    "expire-files": {
        "task": "batches.files_expire",
        "schedule": timedelta(seconds=FILE_EXPIRY_INTERVAL_SECONDS),
    },
    "prune-batch-history": {
        "task": "batches.history_prune",
        "schedule": timedelta(seconds=BATCH_RETENTION_INTERVAL_SECONDS),
    },
    "collect-storage": {
        "task": "batches.storage_collect",
        "schedule": timedelta(seconds=STORAGE_GC_INTERVAL_SECONDS),
    },
    "webhooks-due": {
        "task": "webhooks.deliveries_due",
        "schedule": timedelta(seconds=WEBHOOK_SWEEP_INTERVAL_SECONDS),
    },
    "usage-attribute": {
        "task": "usage.attribute",
        "schedule": USAGE_ATTRIBUTION_INTERVAL_SECONDS,
    },
    "console-samples": {  # the operators' dashboards
        "task": "console.samples_take",
        "schedule": timedelta(seconds=CONSOLE_SAMPLES_INTERVAL_SECONDS),
    },
}
# Beat stamps each message with an expiry; a worker skips a message that a later run of its job has superseded
# (controlplane/core/beat.py says why, and how the sent time is read off the expiry). The expiry itself only bounds
# the queue a stopped control worker finds when it comes back: an hour of sends, each skipped in a few ms. It is far
# longer than any interval on purpose: expiring a message after its own interval (the rule before) dropped every
# message once the queue was longer than that, and housekeeping stopped altogether (docs/RELIABILITY.md).
BEAT_MESSAGE_EXPIRY_SECONDS = 3600.0
for _entry in CELERY_BEAT_SCHEDULE.values():
    _every = _entry["schedule"]
    _seconds = _every.total_seconds() if isinstance(_every, timedelta) else float(_every)
    _entry["options"] = {"expires": max(BEAT_MESSAGE_EXPIRY_SECONDS, 2 * _seconds)}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# Prometheus (controlplane/metrics, docs/OPERATIONS.md). /metrics on the web tier answers only a request with
# `Authorization: Bearer $METRICS_TOKEN`; unset, the endpoint does not exist (404). The database gauges
# (queue, dead shards, breakers, placements) are exported where METRICS_DB_GAUGES=1: one deployment only.
# A Celery worker with WORKER_METRICS_PORT serves its own /metrics on that port (0 = none).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_DB_GAUGES = env_bool("METRICS_DB_GAUGES", False)
WORKER_METRICS_PORT = env_int("WORKER_METRICS_PORT", 0, minimum=0)

# LOG_FORMAT=json: one JSON object per line with the batch, shard and attempt ids (docs/OPERATIONS.md, "Logs").
LOG_FORMAT = env_choice("LOG_FORMAT", "text", logs.FORMATS)
LOGGING = logs.logging_config(log_format=LOG_FORMAT, level=env_str("LOG_LEVEL", "INFO"))
