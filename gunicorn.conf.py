"""gunicorn's configuration, read from the working directory (the repository root) by every `gunicorn` run
there: the local stack and production images alike. Command-line flags still win."""

from __future__ import annotations

import os
from typing import Any

from controlplane.core.observability.logs import gunicorn_logconfig_dict

# gunicorn's own lines (start-up, worker boots and timeouts) in LOG_FORMAT too: with json, every line of
# the web log is one JSON object, like the application's (controlplane/core/observability/logs.py).
logconfig_dict = gunicorn_logconfig_dict(os.environ.get("LOG_FORMAT", "text")) or {}


def post_worker_init(worker: Any) -> None:
    """Each web process connects to the broker before it serves (core/messaging/dispatch.broker_warm)."""
    from controlplane.core.messaging.dispatch import broker_warm

    broker_warm()


def child_exit(server: Any, worker: Any) -> None:
    """A gunicorn worker that exited stops counting in the live gauges of PROMETHEUS_MULTIPROC_DIR."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
