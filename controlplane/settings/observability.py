"""Settings of metrics and logs (docs/operations/metrics.md, docs/operations/logs.md; tracing: tracing.py).

/metrics on the web tier answers only a request with `Authorization: Bearer $METRICS_TOKEN`; unset, the
endpoint does not exist (404). The database gauges (queue, dead shards, breakers, placements) are exported
where METRICS_DB_GAUGES=1: one deployment only. A Celery worker with WORKER_METRICS_PORT serves its own
/metrics on that port."""

from __future__ import annotations

from controlplane.core.env import env_bool, env_choice, env_declare, env_int, env_str
from controlplane.core.observability import logs

METRICS_TOKEN = env_str("METRICS_TOKEN", "", help="The bearer token /metrics requires; empty: no /metrics (404).")
METRICS_DB_GAUGES = env_bool(
    "METRICS_DB_GAUGES", False, help="This deployment's /metrics exports the database gauges (set it on one only)."
)
WORKER_METRICS_PORT = env_int(
    "WORKER_METRICS_PORT", 0, minimum=0, help="Port of a Celery worker's own /metrics (no token); 0: none."
)
# Read by prometheus_client as it is imported, before settings exist (controlplane/core/observability/metrics.py).
env_declare(
    "PROMETHEUS_MULTIPROC_DIR",
    "",
    kind="directory",
    help="Where each process of a prefork server writes its metrics, added up by the one serving /metrics.",
)

LOG_FORMAT = env_choice(
    "LOG_FORMAT", "text", logs.FORMATS, help="json: one JSON object per line, with the batch, shard and attempt ids."
)
LOGGING = logs.logging_config(
    log_format=LOG_FORMAT, level=env_str("LOG_LEVEL", "INFO", help="Level of the root logger (DEBUG, INFO, ...).")
)
# Read by core/observability/logs.py when a formatter is made, which gunicorn does before Django's settings load.
env_declare(
    "LOG_PROCESS_ROLE",
    "",
    kind="string",
    help="The process's role in log lines and span names (web, worker, beat, manage); empty: from the command line.",
)
