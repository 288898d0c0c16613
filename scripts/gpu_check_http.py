"""scripts/gpu_check.py's HTTP to Triton: the standard library only, since the GPU machine has no tritonclient."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

BATCH = 64  # triton_models/minilm max_batch_size: what the control plane sends per call
CLIENTS = 16


def post(base: str, path: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    request = urllib.request.Request(f"{base}{path}", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{path}: HTTP {exc.code} {exc.read().decode(errors='replace')[:400]}") from exc
    return json.loads(raw) if raw else {}


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(f"{base}{path}", timeout=30) as response:
        raw = response.read().decode()
    return json.loads(raw) if path.startswith("/v2") else raw


def load(base: str, name: str, config: dict[str, Any]) -> dict[str, Any]:
    post(base, f"/v2/repository/models/{name}/load", {"parameters": {"config": json.dumps(config)}})
    return get(base, f"/v2/models/{name}/config")


def gpu_groups(kind: str, count: int) -> list[dict[str, Any]]:
    # What controlplane.fleet.placement.reconciler._instance_groups writes for a real GPU server; on a CPU dry run the
    # same instances as KIND_CPU.
    return (
        [{"count": count, "kind": "KIND_GPU", "gpus": [0]}]
        if kind == "KIND_GPU"
        else [{"count": count, "kind": "KIND_CPU"}]
    )


def groups_text(config: dict[str, Any]) -> str:
    return ", ".join(f"{g['count']}x {g['kind']} gpus {g.get('gpus', [])}" for g in config["instance_group"])


def embed_json(base: str, model: str, texts: list[str]) -> tuple[Any, list[int]]:
    import numpy as np

    body = {"inputs": [{"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}]}
    outputs = {o["name"]: o for o in post(base, f"/v2/models/{model}/infer", body)["outputs"]}
    embedding = np.asarray(outputs["EMBEDDING"]["data"], dtype=np.float32).reshape(len(texts), -1)
    return embedding, [int(t) for t in outputs["TOKENS"]["data"]]


class BinaryClient:
    """One keep-alive connection asking for EMBEDDING as binary data: the client stays cheap next to the server."""

    def __init__(self, host: str, port: int, model: str) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=300)
        self.path = f"/v2/models/{model}/infer"

    def call(self, texts: list[str]) -> int:
        body = json.dumps(
            {
                "inputs": [{"name": "TEXT", "shape": [len(texts), 1], "datatype": "BYTES", "data": texts}],
                "outputs": [{"name": "EMBEDDING", "parameters": {"binary_data": True}}],
            }
        ).encode()
        self.conn.request("POST", self.path, body, {"Content-Type": "application/json"})
        response = self.conn.getresponse()
        raw = response.read()
        if response.status != 200:
            raise RuntimeError(f"infer: HTTP {response.status} {raw[:300]!r}")
        header = int(response.getheader("Inference-Header-Content-Length") or len(raw))
        if len(raw) - header != len(texts) * 384 * 4:
            raise RuntimeError(f"infer: {len(raw) - header} bytes of EMBEDDING for {len(texts)} texts")
        return len(texts)


def served_throughput(base: str, model: str, texts: list[str], seconds: float) -> float:
    host, port = base.removeprefix("http://").split(":")
    calls = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    clients = [BinaryClient(host, int(port), model) for _ in range(CLIENTS)]
    for client in clients[:2]:
        client.call(calls[0])  # warm-up
    stop = time.monotonic() + seconds
    done = [0] * CLIENTS

    def worker(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            done[k] += clients[k].call(calls[i % len(calls)])
            i += CLIENTS

    started = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(worker, range(CLIENTS)))
    return sum(done) / (time.monotonic() - started)


def gpu_utilisation_during(seconds: float) -> Callable[[], float | None]:
    """Sample nvidia-smi's utilisation a few times in the background; the returned function gives the mean."""
    samples: list[float] = []

    def sample() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-i", "0"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                ).stdout.strip()
                samples.append(float(out))
            except (OSError, ValueError, subprocess.SubprocessError):
                return
            time.sleep(1.0)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return lambda: (thread.join(seconds + 6), sum(samples) / len(samples) if samples else None)[1]
