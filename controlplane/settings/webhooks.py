"""Settings of webhooks (docs/architecture/webhooks.md): delivery, its deadlines and caps, retries and the
delivery log's housekeeping (webhooks/housekeeping.py, run by the batches' retention sweep: no beat entry of
its own)."""

from __future__ import annotations

from controlplane.core.env import env_bool, env_float, env_int, env_int_list

# Only loopback: private and link-local addresses stay refused. For tests and the local runner.
WEBHOOK_ALLOW_LOOPBACK = env_bool(
    "WEBHOOK_ALLOW_LOOPBACK", False, help="Allow webhook endpoints on 127.0.0.0/8 and ::1."
)
WEBHOOK_EXTRA_PORTS = env_int_list(
    "WEBHOOK_EXTRA_PORTS",
    [],
    minimum=1,
    maximum=65535,
    help="Ports webhook URLs may name besides 80 and 443 (e.g. 8443); every other port is refused.",
)
# One whole delivery attempt (DNS, connect, TLS, send, headers, body), enforced in code (webhooks/delivery.py:
# the worker's thread pool ignores Celery's time limits); a receiver should answer at once and work afterwards.
WEBHOOK_TIMEOUT_SECONDS = env_float(
    "WEBHOOK_TIMEOUT_SECONDS", 10.0, help="Deadline of one whole delivery attempt (DNS to body)."
)
# A webhooks worker process runs at most this many attempts at once per endpoint and per tenant (more wait in
# the database): one tenant's slow receivers cannot hold every thread (webhooks/inflight.py).
WEBHOOK_MAX_INFLIGHT_PER_ENDPOINT = env_int(
    "WEBHOOK_MAX_INFLIGHT_PER_ENDPOINT", 1, minimum=1, help="Delivery attempts at once per endpoint, per process."
)
WEBHOOK_MAX_INFLIGHT_PER_TENANT = env_int(
    "WEBHOOK_MAX_INFLIGHT_PER_TENANT", 2, minimum=1, help="Delivery attempts at once per tenant, per process."
)
# POST /v1/webhook_endpoints/{id}/test waits on the receiver in a web thread: the whole call is cut at this,
# and a web process runs one test per tenant and this many in all at once (more: 429 at once).
WEBHOOK_TEST_TIMEOUT_SECONDS = env_float(
    "WEBHOOK_TEST_TIMEOUT_SECONDS", 5.0, help="Deadline of a test delivery (POST .../test), answered in the request."
)
WEBHOOK_TEST_MAX_INFLIGHT = env_int(
    "WEBHOOK_TEST_MAX_INFLIGHT", 2, minimum=1, help="Test deliveries at once per web process (more: 429)."
)
# Retries: 5 s doubling, at most an hour apart, for a day.
WEBHOOK_RETRY_WINDOW_SECONDS = env_int(
    "WEBHOOK_RETRY_WINDOW_SECONDS",
    24 * 3600,
    minimum=1,
    help="How long after its event a delivery is retried (then `exhausted`).",
)
WEBHOOK_BACKOFF_BASE_SECONDS = env_float(
    "WEBHOOK_BACKOFF_BASE_SECONDS", 5.0, help="Wait before a delivery's first retry; it doubles at each retry."
)
WEBHOOK_BACKOFF_MAX_SECONDS = env_float(
    "WEBHOOK_BACKOFF_MAX_SECONDS", 3600.0, help="Longest wait between two retries of a delivery."
)
# One indexed query.
WEBHOOK_SWEEP_INTERVAL_SECONDS = env_float(
    "WEBHOOK_SWEEP_INTERVAL_SECONDS",
    2.0,
    help="How often beat sends the deliveries that are due (retries, lost messages).",
)
# Closed deliveries (succeeded, exhausted, dropped) and their attempt log are deleted this long after they
# were created: the delivery log an operator reads while debugging an endpoint, kept as long as batch history
# (BATCH_RETENTION_DAYS' default) so one batch's story stays complete.
WEBHOOK_LOG_RETENTION_DAYS = env_int(
    "WEBHOOK_LOG_RETENTION_DAYS", 30, minimum=1, help="Days closed deliveries and their attempt log are kept."
)
# Open deliveries (pending or failed, waiting to be retried) one endpoint may have; beyond it the oldest are
# dropped (status ``dropped``, counted in webhook_deliveries_dropped_total). A dead endpoint of a tenant that
# runs a batch a minute reaches ~1,440 in its 24 h retry window; 1,000 keeps the last ~17 h of its events.
WEBHOOK_MAX_OPEN_PER_ENDPOINT = env_int(
    "WEBHOOK_MAX_OPEN_PER_ENDPOINT",
    1000,
    minimum=1,
    help="Open deliveries one endpoint may have; beyond it the oldest are dropped.",
)
