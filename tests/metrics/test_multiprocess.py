"""Multiprocess mode: processes sharing PROMETHEUS_MULTIPROC_DIR are added up by the process serving /metrics
(gunicorn's workers, a prefork Celery pool), and a Celery worker serves its own /metrics on a port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.metrics.views import metrics_registry
from controlplane.metrics.worker import worker_metrics_serve

REPO = Path(__file__).resolve().parents[2]


def _count_in_child(directory: Path, lines: int) -> None:
    code = (
        "from controlplane.core.observability import metrics as m\n"
        f"m.LINES_COMPLETED.labels(model='mp').inc({lines})\n"
        "m.TRITON_CALLS_IN_FLIGHT.labels(server='s:1').inc()\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_processes_sharing_a_directory_are_added_up(tmp_path, monkeypatch):
    _count_in_child(tmp_path, 3)
    _count_in_child(tmp_path, 4)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    samples = _samples(generate_latest(metrics_registry(db_gauges=False)).decode())
    assert samples[("batch_lines_completed_total", (("model", "mp"),))] == 7
    # livesum: the children have exited but were not marked dead, so their calls still count.
    assert samples[("triton_calls_in_flight", (("server", "s:1"),))] == 2


def test_a_worker_serves_its_own_metrics_on_its_port(settings):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings.WORKER_METRICS_PORT = port
    worker_metrics_serve()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        names = {name for name, _ in _samples(response.read().decode())}
    assert "python_info" in names  # the process's default registry, served without a token on its own port
