"""Celery application. Tasks are thin: they load by id and call a service."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    celeryd_init,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from celery.worker.consumer import Consumer

from controlplane.core.observability.logs import celery_logger_format, task_log_context_end, task_log_context_start
from controlplane.core.workers.database import connections_tidy
from controlplane.core.workers.deadlines import job_deadline_on_task_start
from controlplane.core.workers.gc_tuning import gc_tune_for_throughput
from controlplane.metrics.worker import worker_metrics_serve, worker_process_gone

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

logger = logging.getLogger(__name__)


class BrokerRestartTolerantConsumer(Consumer):
    """Celery's consumer, surviving a Redis restart while it holds unacknowledged (late-ack) messages.

    On a lost connection the consumer collects and closes the connection, which detaches the kombu
    transport from its connection (``transport.client = None``). Channels of that transport are still in
    use: closing them restores their unacked messages, and every task that was running acknowledges its
    message through them when it ends. Both build a Redis connection from ``transport.client`` and raise
    AttributeError ('NoneType' object has no attribute 'hostname'), which Celery treats as unrecoverable:
    the worker shuts down (kombu/celery 5.7.0; every time a busy shard worker sees Redis restart, found by
    tests/chaos). So the failed close is logged, and the transport keeps its client: the late acks then
    reach the restarted broker (acking a message it no longer has is a no-op) or fail as the connection
    errors kombu already tolerates. Lost messages cost nothing here: the work they carried lives in
    Postgres (slots expire and are topped up again, shards keep their leases)."""

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        transport = self.connection.transport if self.connection else None
        client = transport.client if transport is not None else None
        try:
            super().on_connection_error_after_connected(exc)
        except AttributeError:
            logger.warning("closing the lost broker connection failed inside kombu; reconnecting", exc_info=True)
        finally:
            if transport is not None and transport.client is None:
                transport.client = client


# Every task's class: a beat message that a later run of its job has superseded is skipped (core/messaging/beat.py).
app = Celery("controlplane", task_cls="controlplane.core.messaging.beat:BeatAwareTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.worker_consumer = f"{__name__}:{BrokerRestartTolerantConsumer.__name__}"
app.autodiscover_tasks()
# WORKER_METRICS_PORT: each worker serves its own /metrics (controlplane/metrics/worker.py).
celeryd_init.connect(worker_metrics_serve, weak=False)
worker_process_shutdown.connect(worker_process_gone, weak=False)
# Structured logs (controlplane/core/observability/logs.py): Celery's handlers use LOG_FORMAT; each task binds its own ids.
after_setup_logger.connect(celery_logger_format, weak=False)
after_setup_task_logger.connect(celery_logger_format, weak=False)
task_prerun.connect(task_log_context_start, weak=False)
task_postrun.connect(task_log_context_end, weak=False)
# A task keeps its thread's database connection, within Django's rules (settings.CELERY_DB_REUSE_MAX).
task_prerun.connect(connections_tidy, weak=False)
task_postrun.connect(connections_tidy, weak=False)
# Beat's jobs and finalize bound themselves (thread pools ignore time limits): after the tidy, on the kept connection.
task_prerun.connect(job_deadline_on_task_start, weak=False)
# Start-up objects frozen out of the collector's walks, fewer young collections (core/workers/gc_tuning.py).
worker_init.connect(gc_tune_for_throughput, weak=False)
worker_process_init.connect(gc_tune_for_throughput, weak=False)


def _tokenizers_preload_in_background(**_: Any) -> None:
    """worker_process_init (each prefork child of the shard worker): load generation tokenizers in a daemon
    thread, so the process takes tasks at once and its first generation shard finds them loaded. Not in the
    prefork parent: forking while a thread imports could leave the children's import locks held."""
    from django.conf import settings

    if settings.WORKER_PRELOAD_TOKENIZERS:
        threading.Thread(target=_tokenizers_preload, name="tokenizers-preload", daemon=True).start()


def _tokenizers_preload() -> None:
    from django.db import connection

    from controlplane.kinds.registry import tokenizers_preload

    try:
        logger.info("generation tokenizers preloaded: %s", ", ".join(tokenizers_preload()) or "none")
    except Exception:  # noqa: BLE001 - an optimisation: a failure leaves the first shard to load them
        logger.warning("preloading generation tokenizers failed", exc_info=True)
    finally:
        connection.close()  # this thread's own connection


worker_process_init.connect(_tokenizers_preload_in_background, weak=False)
