"""The metric objects the running code updates. No Django, no controlplane imports: any module may import
this one without a cycle, and updating a metric is a counter increment or a histogram observe — per shard or
per Triton call, never per line, never a database query.

Names follow Prometheus' conventions: base units (seconds), ``_total`` on counters, and labels only of small,
operator-controlled sets (model, server, limit, outcome) — never a tenant or batch id; those go to logs and
the ledger.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set *before* prometheus_client is imported, every
process writes its values to files in that directory and the process that serves ``/metrics`` adds them up
(``controlplane.metrics.views.metrics_registry``). Set it per host and per deployment (gunicorn's workers share one directory, a
Celery worker's pool processes another), empty it when the deployment starts, and never share it between
hosts: on Kubernetes each pod serves its own ``/metrics``. Gauges say how they combine across processes
(``multiprocess_mode``); counters and histograms are summed.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# Shards take from well under a second (a few lines) to minutes (1,024 long texts behind a busy model).
SHARD_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# One Triton call: milliseconds for a small tensor, seconds for a full batch of long texts on a CPU.
TRITON_CALL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

LINES_COMPLETED = Counter(
    "batch_lines_completed_total",
    "Input lines answered successfully (output file), counted when their shard commits.",
    ["model"],
)
LINES_FAILED = Counter(
    "batch_lines_failed_total",
    "Input lines answered with an error (error file), counted when their shard commits.",
    ["model"],
)
SHARD_DURATION = Histogram(
    "shard_duration_seconds",
    "Wall time of a committed shard attempt, from the start of its run to its commit.",
    ["model"],
    buckets=SHARD_DURATION_BUCKETS,
)
TRITON_CALL_DURATION = Histogram(
    "triton_call_duration_seconds",
    "Latency of one Triton infer call (failed calls included), by Triton model name and server address.",
    ["model", "server"],
    buckets=TRITON_CALL_BUCKETS,
)
TRITON_CALLS_IN_FLIGHT = Gauge(
    "triton_calls_in_flight",
    "Triton infer calls sent and not yet answered, by server address.",
    ["server"],
    multiprocess_mode="livesum",  # the sum over live processes: a dead worker's calls are not in flight
)
CONSOLIDATION_MOVES = Counter(
    "placement_consolidation_moves_total",
    "Instances moved make-before-break to make room for a model that fit nowhere, by moved model and outcome "
    "(ok: the new instance was ready and the old one unloaded; failed: the new one did not load, the old stays).",
    ["model", "outcome"],
)
QUOTA_REJECTIONS = Counter(
    "quota_rejections_total",
    "Requests refused with a 429 by a quota or rate limit, by the limit's name.",
    ["limit"],
)
TRITON_SCRAPE_ERRORS = Counter(
    "batch_triton_scrape_errors_total",
    "Scrapes of a registered Triton server's /metrics that failed or timed out (metrics/triton_scrape.py).",
    ["server"],
)
WEBHOOK_DELIVERIES_DROPPED = Counter(
    "webhook_deliveries_dropped_total",
    "Open webhook deliveries given up because their endpoint had too many waiting (oldest first).",
)
WEBHOOK_DELIVERIES = Counter(
    "webhook_deliveries_total",
    "Webhook delivery attempts by outcome (succeeded, failed).",
    ["outcome"],
)


def shard_committed(*, model: str, completed: int, failed: int, seconds: float) -> None:
    """A shard attempt's part was committed: its lines and its duration (once per shard)."""
    LINES_COMPLETED.labels(model=model).inc(completed)
    LINES_FAILED.labels(model=model).inc(failed)
    SHARD_DURATION.labels(model=model).observe(seconds)
