"""bench/run.py's figures taken straight from the stack's tritonserver, beside the end-to-end path: the served
minilm's counters, its instance count, the served config under the tuner's load (a3) and a naive client (b)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def model_counters(client) -> dict[str, int]:
    """Triton's cumulative statistics of the served model: executions, texts and compute nanoseconds."""
    stats = client.model_statistics("minilm").get("model_stats", [])
    return {
        "executions": sum(int(e.get("execution_count", 0) or 0) for e in stats),
        "inferences": sum(int(e.get("inference_count", 0) or 0) for e in stats),
        # Per execution (batch_stats), not per request: inference_stats charges a merged execution's time
        # to each request in it.
        "compute_ns": sum(
            int(b.get(part, {}).get("ns", 0) or 0)
            for e in stats
            for b in e.get("batch_stats", [])
            for part in ("compute_input", "compute_infer", "compute_output")
        ),
    }


def instances(client) -> int:
    return sum(g.get("count", 1) for g in client.model_config("minilm").get("instance_group", []))


# The calls a placed instance is fed at most (SCHEDULER_CALLS_PER_INSTANCE's default), as the tuner offers them.
SERVED_CONCURRENCY = 6


def served_direct(url: str, texts: list[str], rows: int) -> float:
    """(a3): texts/s of the served minilm under the tuner's load (calls of ``rows`` texts), the whole corpus dealt in
    length order."""
    from build_engines.tune_config import parse
    from build_engines.tune_measure import Load, Workload, offer_load

    config = parse((REPO_ROOT / "triton_models" / "minilm" / "config.pbtxt").read_text())
    load = Load(concurrency=SERVED_CONCURRENCY, call_rows=None, warmup_s=1.0, measure_s=6.0)
    measured = offer_load(url, "minilm", Workload(config, texts, load.dynamic_dim), load, rows)
    if not measured.ok:
        raise RuntimeError(f"the served minilm failed under load: {measured.error}")
    return measured.rows_per_s


def bench_direct_naive(client, texts: list[str]) -> float:
    client.infer("minilm", {"TEXT": np.array([[texts[0].encode()]], dtype=np.object_)}, ["EMBEDDING"])
    start = time.perf_counter()
    for text in texts:
        client.infer("minilm", {"TEXT": np.array([[text.encode()]], dtype=np.object_)}, ["EMBEDDING", "TOKENS"])
    return len(texts) / (time.perf_counter() - start)
