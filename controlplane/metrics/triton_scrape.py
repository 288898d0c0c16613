"""Triton's own ``/metrics``, re-exported by the database-gauge process (METRICS_DB_GAUGES=1, collector.py)
under this service's conventions: base units (seconds, not microseconds), ``_total`` counters, ``batch_triton_``
names, and labels ``server`` (the registered name) and ``model`` (Triton's model name) — summed over model
versions and failure reasons.

Only healthy registered servers with a ``metrics_url`` are scraped, all at once, each with a short timeout:
a server that does not answer is skipped and counted in ``batch_triton_scrape_errors_total``, and never
holds up the scrape of this service's metrics for long. The endpoint is plain Prometheus text over HTTP,
not the inference API, so it is read here with urllib (as fleet/membership/inventory.py does), not via triton/client.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from controlplane.core.observability import metrics
from controlplane.fleet.models import ServerState, TritonServer
from controlplane.triton.client import metrics_text

logger = logging.getLogger(__name__)

# Per server, servers in parallel: Prometheus waits for our /metrics (10 s scrape timeout by default), and
# a healthy Triton answers its metrics in milliseconds, so one second only ever cuts off a hung server.
SCRAPE_TIMEOUT_SECONDS = 1.0
# Servers scraped at once; a fleet larger than this takes a few rounds of at most the timeout each.
MAX_PARALLEL_SCRAPES = 8


@dataclass(frozen=True)
class Mapped:
    name: str  # ours, without _total
    help: str
    counter: bool
    by: str  # the Triton label kept as ours: "model", "gpu" (from gpu_uuid) or "" (per server)
    scale: float = 1.0
    extra: tuple[tuple[str, str], ...] = ()  # constant labels (the request outcome)


_US = 1e-6
_MAP: dict[str, Mapped] = {
    "nv_inference_request_success": Mapped(
        "batch_triton_inference_requests",
        "Inference requests Triton answered, by outcome.",
        True,
        "model",
        extra=(("outcome", "success"),),
    ),
    "nv_inference_request_failure": Mapped(
        "batch_triton_inference_requests",
        "Inference requests Triton answered, by outcome.",
        True,
        "model",
        extra=(("outcome", "failure"),),
    ),
    "nv_inference_count": Mapped("batch_triton_inferences", "Inferences (batch rows) Triton ran.", True, "model"),
    "nv_inference_exec_count": Mapped(
        "batch_triton_executions", "Model executions (dynamic batches) Triton ran.", True, "model"
    ),
    "nv_inference_request_duration_us": Mapped(
        "batch_triton_request_seconds", "Cumulative request time inside Triton.", True, "model", _US
    ),
    "nv_inference_queue_duration_us": Mapped(
        "batch_triton_queue_seconds", "Cumulative time requests waited in Triton's queue.", True, "model", _US
    ),
    "nv_inference_compute_input_duration_us": Mapped(
        "batch_triton_compute_input_seconds", "Cumulative time preparing inputs.", True, "model", _US
    ),
    "nv_inference_compute_infer_duration_us": Mapped(
        "batch_triton_compute_seconds", "Cumulative model execution (compute) time.", True, "model", _US
    ),
    "nv_inference_compute_output_duration_us": Mapped(
        "batch_triton_compute_output_seconds", "Cumulative time extracting outputs.", True, "model", _US
    ),
    "nv_inference_pending_request_count": Mapped(
        "batch_triton_pending_requests", "Requests waiting in Triton to execute, now.", False, "model"
    ),
    "nv_gpu_utilization": Mapped("batch_triton_gpu_utilization_ratio", "GPU utilisation (0-1).", False, "gpu"),
    "nv_gpu_memory_used_bytes": Mapped("batch_triton_gpu_memory_used_bytes", "GPU memory in use.", False, "gpu"),
    "nv_gpu_memory_total_bytes": Mapped("batch_triton_gpu_memory_total_bytes", "GPU memory.", False, "gpu"),
    "nv_cpu_utilization": Mapped("batch_triton_cpu_utilization_ratio", "Host CPU utilisation (0-1).", False, ""),
    "nv_cpu_memory_used_bytes": Mapped("batch_triton_cpu_memory_used_bytes", "Host memory in use.", False, ""),
}
_LABEL_SOURCE = {"model": "model", "gpu": "gpu_uuid"}

# Our metric name -> {label values (the `by` label, then the constant ones) -> value}.
TritonValues = dict[str, dict[tuple[tuple[str, str], ...], float]]


def triton_values(text: str) -> TritonValues:
    """Triton's exposition -> our names, base units, summed over versions and failure reasons. Pure."""
    values: TritonValues = {}
    for family in text_string_to_metric_families(text):
        mapped = _MAP.get(family.name)
        if mapped is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue  # the parser's own companion sample of a counter, not Triton's value
            labels: tuple[tuple[str, str], ...] = ()
            if mapped.by:
                labels = ((mapped.by, sample.labels.get(_LABEL_SOURCE[mapped.by], "")),)
            key = labels + mapped.extra
            series = values.setdefault(mapped.name, {})
            series[key] = series.get(key, 0.0) + sample.value * mapped.scale
    return values


@dataclass(frozen=True)
class ScrapeTarget:
    server: str
    url: str


def scrape(targets: Iterable[ScrapeTarget]) -> dict[str, TritonValues]:
    """Each target's values by server name; a target that fails or is late is left out and counted."""
    targets = list(targets)
    if not targets:
        return {}
    results: dict[str, TritonValues] = {}
    executor = ThreadPoolExecutor(
        max_workers=min(MAX_PARALLEL_SCRAPES, len(targets)), thread_name_prefix="triton-scrape"
    )
    try:
        futures = {
            executor.submit(metrics_text, target.url, timeout_s=SCRAPE_TIMEOUT_SECONDS): target for target in targets
        }
        # A little over the timeout: urlopen's timeout covers connect and each read, not a slow DNS answer.
        done, _ = wait(futures, timeout=SCRAPE_TIMEOUT_SECONDS * (1 + len(targets) // MAX_PARALLEL_SCRAPES) + 0.5)
        for future, target in futures.items():
            try:
                if future not in done:
                    raise TimeoutError(f"no answer within {SCRAPE_TIMEOUT_SECONDS} s")
                results[target.server] = triton_values(future.result())
            except Exception as exc:  # noqa: BLE001 - any failure: skip the server, count it, go on
                metrics.TRITON_SCRAPE_ERRORS.labels(server=target.server).inc()
                logger.info("triton metrics of %s (%s) not read: %s", target.server, target.url, exc)
    finally:
        executor.shutdown(wait=False, cancel_futures=True)  # a hung request's thread ends at its own timeout
    return results


def families(scraped: dict[str, TritonValues]) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Prometheus families of every mapped metric (declared even when no server answered)."""
    by_name = {mapped.name: mapped for mapped in _MAP.values()}
    for name, mapped in by_name.items():
        label_names = ["server", *([mapped.by] if mapped.by else []), *(key for key, _ in mapped.extra)]
        if mapped.counter:
            family: CounterMetricFamily | GaugeMetricFamily = CounterMetricFamily(name, mapped.help, labels=label_names)
        else:
            family = GaugeMetricFamily(name, mapped.help, labels=label_names)
        for server, values in sorted(scraped.items()):
            for labels, value in sorted(values.get(name, {}).items()):
                family.add_metric([server, *(v for _, v in labels)], value)
        yield family


def triton_families() -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """collector.py: scrape the healthy registered servers that have a metrics URL."""
    rows = (
        TritonServer.objects.filter(state=ServerState.HEALTHY)
        .exclude(metrics_url="")
        .order_by("name")
        .values_list("name", "metrics_url")
    )
    yield from families(scrape(ScrapeTarget(server=name, url=url) for name, url in rows))
