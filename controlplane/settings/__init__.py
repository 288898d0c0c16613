"""Django settings (DJANGO_SETTINGS_MODULE=controlplane.settings): this module (Django, database, Celery and
its beat schedule) and one module per concern beside it (paths, security, batches, scheduling, storage, fleet,
webhooks, usage, console, observability, tracing, openapi), whose values it imports. Apps read every value as
``django.conf.settings.X``, never from these modules.

Every value comes from the environment through controlplane.core.env, with embedded defaults that run
the whole service on one machine with no services (SQLite, kombu's filesystem broker, local storage).
Production sets DATABASE_URL, CELERY_BROKER_URL and storage variables. Every variable, its default and its
meaning: docs/operations/configuration.md (python -m scripts.config_reference writes it from these modules).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dj_database_url

from controlplane.core.env import (
    SECRET_KEY_FILENAME,
    env_bool,
    env_declare,
    env_int,
    env_list,
    env_secret_key,
    env_str,
)
from controlplane.core.messaging import fs_broker, queues
from controlplane.settings.batches import *  # noqa: F403
from controlplane.settings.batches import (
    BATCH_RETENTION_INTERVAL_SECONDS,
    EXPIRY_INTERVAL_SECONDS,
    FILE_EXPIRY_INTERVAL_SECONDS,
    IDEMPOTENCY_PRUNE_INTERVAL_SECONDS,
    OUTBOX_RELAY_INTERVAL_SECONDS,
    RESCUE_INTERVAL_SECONDS,
    STORAGE_GC_INTERVAL_SECONDS,
)
from controlplane.settings.console import *  # noqa: F403
from controlplane.settings.console import CONSOLE_SAMPLES_INTERVAL_SECONDS
from controlplane.settings.fleet import *  # noqa: F403
from controlplane.settings.fleet import (
    FLEET_HEARTBEAT_INTERVAL_SECONDS,
    FLEET_RECONCILE_INTERVAL_SECONDS,
    FLEET_SCALING,
)
from controlplane.settings.observability import *  # noqa: F403
from controlplane.settings.openapi import SPECTACULAR_SETTINGS as SPECTACULAR_SETTINGS
from controlplane.settings.paths import BASE_DIR as BASE_DIR
from controlplane.settings.paths import VAR_DIR as VAR_DIR
from controlplane.settings.scheduling import *  # noqa: F403
from controlplane.settings.scheduling import SCHEDULER_TOPUP_INTERVAL_SECONDS
from controlplane.settings.security import *  # noqa: F403
from controlplane.settings.storage import *  # noqa: F403
from controlplane.settings.tracing import *  # noqa: F403
from controlplane.settings.usage import *  # noqa: F403
from controlplane.settings.usage import SPEND_CAP_INTERVAL_SECONDS, USAGE_ATTRIBUTION_INTERVAL_SECONDS
from controlplane.settings.webhooks import *  # noqa: F403
from controlplane.settings.webhooks import WEBHOOK_SWEEP_INTERVAL_SECONDS

DEBUG = env_bool("DJANGO_DEBUG", False, help="Django's DEBUG: tracebacks on error pages. Never in production.")
# DJANGO_SECRET_KEY, else the local runner's generated var/secret_key; the public embedded key only with
# DEBUG. Anything else stops every process at start-up (core/env.py, env_secret_key, says why).
SECRET_KEY = env_secret_key(
    "DJANGO_SECRET_KEY",
    key_file=VAR_DIR / SECRET_KEY_FILENAME,
    debug=DEBUG,
    help="Django's signing key: a long random value (required outside DEBUG unless the local runner made one).",
)
ALLOWED_HOSTS = env_list(
    "DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"], help="The host names the service answers to."
)
# Set by manage.py, wsgi.py and celery.py before Django reads it.
env_declare("DJANGO_SETTINGS_MODULE", "controlplane.settings", kind="Python module", help="Django's settings module.")

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
    "controlplane.core.http.request_log.RequestLogMiddleware",  # request id + batch id on every log line (logs.py)
    "controlplane.core.http.middleware.RejectNulMiddleware",  # ?after=%00 is a 400, not a Postgres error
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
    "default": dj_database_url.parse(
        env_str("DATABASE_URL", _SQLITE_URL, help="The database, e.g. postgres://user:password@host:5432/name."),
        conn_max_age=60,
        conn_health_checks=True,
    )
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
        help="The test database's name; default: test_ and the configured database's name.",
    )
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
STATIC_URL = "static/"
SERVE_STATIC = env_bool(
    "SERVE_STATIC", True, help="The web process serves static files itself (0: an ingress or CDN serves them)."
)
STATIC_ROOT = VAR_DIR / "static"

# Storage (MEDIA_ROOT, STORAGES, upload spooling): storage.py.

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["controlplane.tenants.auth.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["controlplane.tenants.auth.IsTenant"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only (API_MAX_JSON_BYTES, no 500 on hostile JSON). Multipart is parsed by POST /v1/files alone
    # (files/views.py), under FILE_MAX_BYTES and the storage quota: a global multipart parser let any endpoint
    # spool a body of any size to a temporary file before its 400. Anything else is a 415, unread.
    "DEFAULT_PARSER_CLASSES": ["controlplane.core.http.parsers.LimitedJSONParser"],
    "EXCEPTION_HANDLER": "controlplane.core.http.errors.api_exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # `?format=` is no API parameter: DRF would answer `?format=csv` on any endpoint with a 404.
    "URL_FORMAT_OVERRIDE": None,
}


# Product limits, shards and the data lifecycle: batches.py. The scheduler: scheduling.py. HTTP security: security.py.
# Webhooks: webhooks.py. Triton, placement and the fleet size (FLEET_SCALING): fleet.py. Metrics, logs:
# observability.py.

# --- Celery ---------------------------------------------------------------------------------------
_broker_dir = VAR_DIR / "broker"
CELERY_BROKER_URL = env_str(
    "CELERY_BROKER_URL", "filesystem://", help="The Celery broker, e.g. redis://host:6379/0; filesystem:// is embedded."
)
# Read whatever the broker, so that it is listed in the reference.
_broker_key_prefix = env_str(
    "CELERY_BROKER_KEY_PREFIX", "", help="Prefix of the broker's Redis keys: stacks sharing one Redis stay apart."
)
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's filesystem transport, whose message files are never read half-written (core/messaging/fs_broker.py).
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
    if _broker_key_prefix:
        CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = _broker_key_prefix
CELERY_TASK_IGNORE_RESULT = True
# Celery's Django fixup closes every database connection before and after each task unless this is set, so each
# task (a beat tick: ~4 a second) would open a new Postgres connection, a backend fork. Set, a task keeps its thread's
# connection as a request does: Django's own rules decide before and after each task (CONN_MAX_AGE, the health
# check, a connection left in error; core/workers/database.py, connections_tidy). The fixup still closes them after
# this many tasks of a process, a bound on nothing that matters here.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int(
    "CELERY_TASK_SOFT_TIME_LIMIT", 900, help="Celery's soft time limit of a task, in seconds (prefork workers)."
)
CELERY_TASK_TIME_LIMIT = env_int(
    "CELERY_TASK_TIME_LIMIT", 960, help="Celery's hard time limit of a task, in seconds (prefork workers)."
)
CELERY_TASK_DEFAULT_QUEUE = queues.DEFAULT_QUEUE
CELERY_TASK_ROUTES = {task: {"queue": queue} for task, queue in queues.TASK_QUEUES.items()}
CELERY_TASK_ALWAYS_EAGER = env_bool(
    "CELERY_TASK_ALWAYS_EAGER", False, help="Tasks run in the process that sends them, not in a worker (tests)."
)
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
    "spend-caps": {
        "task": "batches.spend_caps_enforce",
        "schedule": timedelta(seconds=SPEND_CAP_INTERVAL_SECONDS),
    },
    "console-samples": {  # the operators' dashboards
        "task": "console.samples_take",
        "schedule": timedelta(seconds=CONSOLE_SAMPLES_INTERVAL_SECONDS),
    },
}
# Beat stamps each message with an expiry; a worker skips a message that a later run of its job has superseded
# (controlplane/core/messaging/beat.py says why, and how the sent time is read off the expiry). The expiry itself only bounds
# the queue a stopped control worker finds when it comes back: an hour of sends, each skipped in a few ms. It is far
# longer than any interval on purpose: expiring a message after its own interval would drop every message once the
# queue is longer than that, and housekeeping would stop altogether.
BEAT_MESSAGE_EXPIRY_SECONDS = 3600.0
for _entry in CELERY_BEAT_SCHEDULE.values():
    _every = _entry["schedule"]
    _seconds = _every.total_seconds() if isinstance(_every, timedelta) else float(_every)
    _entry["options"] = {"expires": max(BEAT_MESSAGE_EXPIRY_SECONDS, 2 * _seconds)}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
