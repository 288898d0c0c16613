"""``GET /metrics``: this process's (or, in multiprocess mode, this host deployment's) metrics in the
Prometheus text format, for a scraper holding ``METRICS_TOKEN``; the database gauges where
``METRICS_DB_GAUGES`` is set."""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterator

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from controlplane.metrics.collector import DatabaseCollector


class _ProcessCollector(Collector):
    """The process's default registry, inside a registry of one scrape."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def metrics_registry(*, db_gauges: bool) -> CollectorRegistry:
    """What one scrape exports: every process's files in PROMETHEUS_MULTIPROC_DIR when it is set (the
    process's own default registry otherwise), plus the database gauges when asked."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ProcessCollector())
    if db_gauges:
        registry.register(DatabaseCollector())
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    token = settings.METRICS_TOKEN
    if not token:
        raise Http404("metrics are disabled")
    given = request.headers.get("Authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        return HttpResponse(
            "unauthorized\n", status=401, content_type="text/plain", headers={"WWW-Authenticate": "Bearer"}
        )
    body = generate_latest(metrics_registry(db_gauges=settings.METRICS_DB_GAUGES))
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
