"""A Celery worker's own ``/metrics``: with ``WORKER_METRICS_PORT`` set, the worker's main process serves its
metrics on that port (all interfaces; keep the port inside the cluster network: it carries no token). With a
prefork pool set ``PROMETHEUS_MULTIPROC_DIR`` per worker deployment: the pool's processes write their files
there and the main process adds them up. Wired in controlplane/celery.py; no Django models here, the Celery
app imports this module before Django is set up."""

from __future__ import annotations

import logging
import os
from typing import Any

from prometheus_client import CollectorRegistry, multiprocess, start_http_server

logger = logging.getLogger(__name__)


def worker_metrics_serve(**_: Any) -> None:
    """celeryd_init: start the metrics HTTP server in the worker's main process, before its pool forks."""
    from django.conf import settings

    port = settings.WORKER_METRICS_PORT
    if not port:
        return
    registry: CollectorRegistry | None = None
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry(auto_describe=False)
        multiprocess.MultiProcessCollector(registry)
    if registry is None:
        start_http_server(port)
    else:
        start_http_server(port, registry=registry)
    logger.info("worker metrics on port %s", port)


def worker_process_gone(**_: Any) -> None:
    """worker_process_shutdown: a pool process's live gauges (calls in flight) stop counting."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.mark_process_dead(os.getpid())
