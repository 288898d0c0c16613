"""A victim tenant's view of the API during an abuse scenario (tests/chaos/test_tenant_abuse.py,
test_slowloris.py): a dashboard's polling, back to back, each call timed."""

from __future__ import annotations

import datetime
import threading
import time

import requests


def quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def api_probe(
    client: requests.Session,
    base_url: str,
    batch_id: str,
    stop: threading.Event,
    latencies: list[float],
    bad: list[int],
    calls: list[tuple[float, str, str]] | None = None,
) -> None:
    """The victim's polling: list and retrieve, as a dashboard would, back to back. ``calls`` gets (seconds, path,
    UTC start) of each call, so a slow one can be found in the stack's logs."""
    paths = ["/batches?limit=10", f"/batches/{batch_id}", "/files?limit=10"]
    while not stop.is_set():
        path = paths[len(latencies) % len(paths)]
        at = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
        started = time.perf_counter()
        response = client.get(base_url + path, timeout=60)
        latencies.append(time.perf_counter() - started)
        if calls is not None:
            calls.append((latencies[-1], path, at))
        if response.status_code != 200:
            bad.append(response.status_code)
        time.sleep(0.05)


def latency_details(under: list[float], quiet: list[float]) -> dict[str, float | int]:
    """The figures of the victim's calls (each list sorted): under the abuse, and in the quiet phase before it."""
    return {
        "victim_requests": len(under),
        "victim_p50_s": round(quantile(under, 0.5), 3),
        "victim_p99_s": round(quantile(under, 0.99), 3),
        "victim_max_s": round(under[-1], 3) if under else float("nan"),
        "baseline_requests": len(quiet),
        "baseline_p50_s": round(quantile(quiet, 0.5), 3),
        "baseline_p99_s": round(quantile(quiet, 0.99), 3),
    }
