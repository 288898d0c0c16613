"""The orchestrator's real counterparts (deploy/local/orchestrator.py): the desired-servers gauge read from
the control plane's /metrics, registration and drain through its management commands, and tritonserver
processes on free ports. The unit tests replace them with fakes; the autoscaling scenario
(tests/e2e/test_autoscale.py) runs these."""

from __future__ import annotations

import json
import logging
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from deploy.local.triton_server import (
    DEFAULT_MODEL_REPOSITORY,
    free_port,
    start_local_server,
    stop_local_server,
    wait_until_ready,
)

logger = logging.getLogger("deploy.local.orchestrator")
GAUGE = "batch_fleet_desired_servers"


@dataclass
class LocalServer:
    """A tritonserver this orchestrator runs."""

    name: str
    http_url: str
    grpc_url: str
    metrics_url: str
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class MetricsGauge:
    """Reads the desired-servers gauge of one pool from a Prometheus text endpoint (bearer token)."""

    url: str
    token: str
    pool: str = "default"
    # A scrape that takes longer than this is treated as unreadable (hold), not waited for.
    timeout_s: float = 5.0

    def desired_servers(self) -> int | None:
        request = urllib.request.Request(self.url, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode()
        except OSError as exc:
            logger.warning("scraping %s failed: %s", self.url, exc)
            return None
        return desired_from_text(text, self.pool)


def desired_from_text(text: str, pool: str) -> int | None:
    """`batch_fleet_desired_servers{pool=...}` from Prometheus text, or None when the pool is absent."""
    for family in text_string_to_metric_families(text):
        if family.name != GAUGE:
            continue
        for sample in family.samples:
            if sample.labels.get("pool") == pool:
                return max(0, round(sample.value))
    return None


@dataclass
class ManageFleetControl:
    """Registration and drain through the control plane's management commands (interfaces: fleet sizing)."""

    manage: Callable[..., subprocess.CompletedProcess[str]]
    pool: str = "default"
    gpu_memory_gib: float = 16.0

    def register(self, server: LocalServer) -> None:
        self.manage(
            "fleet_register",
            "--name",
            server.name,
            "--grpc-url",
            server.grpc_url,
            "--http-url",
            server.http_url,
            "--metrics-url",
            server.metrics_url,
            "--pool",
            self.pool,
            "--gpu-memory-gib",
            f"{self.gpu_memory_gib:g}",
        )

    def drain(self, name: str, timeout_s: float) -> bool:
        result = self.manage("fleet_drain", "--name", name, "--timeout", f"{timeout_s:g}", check=False)
        if result.returncode not in (0, 1):  # 1 is "still draining"; anything else is a failure
            logger.error("fleet_drain %s exited %s: %s%s", name, result.returncode, result.stdout, result.stderr)
        return result.returncode == 0


@dataclass
class HttpFleetControl:
    """Registration and drain through `POST /internal/fleet/servers[/<name>/drain]` (FLEET_TOKEN): what a
    Triton pod's sidecar and PreStop hook call. No process start per call, unlike ManageFleetControl: on a
    loaded 2-core host a manage.py run costs seconds of every scale-out."""

    base_url: str  # the control plane's web, e.g. http://127.0.0.1:8000
    token: str
    pool: str = "default"
    gpu_memory_gib: float = 16.0
    # The endpoint waits at most 60 s per drain call (internal_views.MAX_WAIT_SECONDS).
    max_wait_s: float = 60.0

    def register(self, server: LocalServer) -> None:
        body = {
            "name": server.name,
            "grpc_url": server.grpc_url,
            "http_url": server.http_url,
            "metrics_url": server.metrics_url,
            "pool": self.pool,
            "gpu_memory_gib": [self.gpu_memory_gib],
        }
        self._post("/internal/fleet/servers", body, timeout_s=30.0)

    def drain(self, name: str, timeout_s: float) -> bool:
        wait = min(timeout_s, self.max_wait_s)
        path = f"/internal/fleet/servers/{urllib.parse.quote(name, safe='')}/drain?wait={wait:g}"
        return self._post(path, None, timeout_s=wait + 15.0) == 200  # 202: still draining

    def _post(self, path: str, body: Mapping[str, object] | None, *, timeout_s: float) -> int:
        request = urllib.request.Request(
            self.base_url.rstrip("/") + path,
            data=json.dumps(body or {}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"POST {path}: {exc.code} {exc.read().decode(errors='replace')[:500]}") from exc


@dataclass
class LocalTritonLauncher:
    """tritonserver processes on free ports, each logging to `<log_dir>/<name>.log`."""

    log_dir: Path
    model_repository: Path = DEFAULT_MODEL_REPOSITORY
    # A cold tritonserver answers ready in 1-3 s here; the margin covers a busy 2-core host.
    ready_timeout_s: float = 60.0

    def spawn(self, name: str) -> LocalServer:
        http, grpc, metrics = free_port(), free_port(), free_port()
        proc = start_local_server(
            self.model_repository,
            http,
            grpc,
            metrics,
            log_path=self.log_dir / f"{name}.log",
            # Scale-in stops a drained server: nothing is in flight, so a short exit wait is enough.
            extra_args=("--exit-timeout-secs=5",),
            # Dies with the runner: spawned from the orchestrator's loop thread, which ends only in stop().
            die_with_parent=True,
        )
        return LocalServer(
            name, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{metrics}/metrics", proc
        )

    def wait_ready(self, server: LocalServer) -> None:
        wait_until_ready(
            server.http_url, self.ready_timeout_s, proc=server.proc, log_path=self.log_dir / f"{server.name}.log"
        )

    def alive(self, server: LocalServer) -> bool:
        return server.proc is not None and server.proc.poll() is None

    def stop(self, server: LocalServer) -> None:
        if server.proc is not None:
            stop_local_server(server.proc, timeout_s=15)
