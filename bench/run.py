"""Benchmark harness: one run, one corpus, side-by-side figures and their ratios.

  (a) in-process MiniLM, length-sorted batches of 64 — the ceiling on this machine
  (b) a naive direct Triton client, one text per request, one request at a time
  (c) the full path: upload → batch → completed output file, through the REST API and the SDK
  (d) create→completed latency of a 100-line batch (p50 / p90 over several runs)

The last line is machine-readable: RATIOS e2e_vs_inprocess=<x> e2e_vs_direct_naive=<y>.
`--quick` uses a smaller corpus and finishes in a few minutes."""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "for",
    "on",
    "with",
    "as",
    "by",
    "at",
    "from",
    "that",
    "this",
    "it",
    "be",
    "are",
    "was",
    "or",
    "an",
    "which",
    "batch",
    "inference",
    "server",
    "model",
    "request",
    "shard",
    "worker",
    "throughput",
    "latency",
    "queue",
    "tenant",
    "output",
    "file",
    "embedding",
    "vector",
    "token",
    "sentence",
    "length",
    "dynamic",
    "batching",
    "triton",
    "control",
    "plane",
    "placement",
    "memory",
    "gpu",
    "cpu",
    "cluster",
]


def corpus(n: int, seed: int = 42) -> list[str]:
    """Sentences of mixed length (3..120 words), like a real embedding workload's long tail."""
    rng = random.Random(seed)
    lengths = [min(120, max(3, int(rng.lognormvariate(2.8, 0.7)))) for _ in range(n)]
    return [" ".join(rng.choices(WORDS, k=k)) for k in lengths]


def bench_inprocess(texts: list[str]) -> float:
    from deploy.local.inprocess import InProcessMiniLM

    model = InProcessMiniLM()
    model.embed(texts[:64])  # warm-up
    start = time.perf_counter()
    model.embed(texts, batch_size=64, sort_by_length=True)
    return len(texts) / (time.perf_counter() - start)


def bench_direct_naive(client, texts: list[str]) -> float:
    client.infer("minilm", {"TEXT": np.array([[texts[0].encode()]], dtype=np.object_)}, ["EMBEDDING"])
    start = time.perf_counter()
    for text in texts:
        client.infer("minilm", {"TEXT": np.array([[text.encode()]], dtype=np.object_)}, ["EMBEDDING", "TOKENS"])
    return len(texts) / (time.perf_counter() - start)


def _jsonl(texts: list[str], prefix: str) -> io.BytesIO:
    return io.BytesIO(
        b"".join(
            json.dumps(
                {
                    "custom_id": f"{prefix}-{i}",
                    "method": "POST",
                    "url": "/v1/embeddings",
                    "body": {"model": "all-MiniLM-L6-v2", "input": t},
                }
            ).encode()
            + b"\n"
            for i, t in enumerate(texts)
        )
    )


def run_batch(sdk, texts: list[str], prefix: str) -> tuple[float, object]:
    """Seconds from upload start to a downloaded output file."""
    start = time.perf_counter()
    uploaded = sdk.files.create(file=(f"{prefix}.jsonl", _jsonl(texts, prefix)), purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        # 100 ms: a tight poll loop would steal CPU from Triton on this 2-core host and skew the figure.
        time.sleep(0.1)
        batch = sdk.batches.retrieve(batch.id)
    if batch.status != "completed" or batch.request_counts.failed:
        raise RuntimeError(f"benchmark batch ended {batch.status}: {batch.errors} {batch.request_counts}")
    content = sdk.files.content(batch.output_file_id).content
    assert content.count(b"\n") == len(texts)
    return time.perf_counter() - start, batch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller corpus, fewer repetitions")
    parser.add_argument(
        "--embedded", action="store_true", help="SQLite + filesystem broker instead of Postgres + Redis"
    )
    args = parser.parse_args()
    n_texts, n_naive, n_small = (768, 256, 5) if args.quick else (3072, 768, 11)
    texts = corpus(n_texts)

    import psycopg
    from openai import OpenAI

    from controlplane.triton.client import TritonClient
    from deploy.local.stack import Stack, find_free_port

    results: dict[str, float] = {}
    print(
        f"corpus: {n_texts} texts, mean {statistics.mean(len(t.split()) for t in texts):.1f} words; "
        f"cores: {os.cpu_count()}",
        flush=True,
    )
    results["inprocess"] = bench_inprocess(texts)
    print(f"  in-process done: {results['inprocess']:.1f} texts/s", flush=True)

    var_dir = REPO_ROOT / "var" / "bench"
    env = {"SHARD_MAX_LINES": os.environ.get("SHARD_MAX_LINES", "256")}
    admin_url = "postgresql://postgres@127.0.0.1:5432/postgres"
    db_name = f"cp_bench_{uuid.uuid4().hex[:6]}"
    if args.embedded:
        env.update({"DATABASE_URL": "", "CELERY_BROKER_URL": "filesystem://"})
    else:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{db_name}"')
        env.update(
            {
                "DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{db_name}",
                "CELERY_BROKER_URL": "redis://127.0.0.1:6379/13",
            }
        )
    stack = Stack(var_dir=var_dir, web_port=find_free_port(), env=env)
    try:
        stack.start()
        # The runner registered its Triton as a managed server and the reconciler loaded the shipped
        # models (minilm, identity, scale2) before start() returned: this is that warm-up's wall time.
        results["warm_s"] = stack.warm_seconds
        client = TritonClient(stack.triton_grpc_url, timeout_s=300)
        results["direct_naive"] = bench_direct_naive(client, texts[:n_naive])
        print(f"  direct naive done: {results['direct_naive']:.1f} texts/s", flush=True)
        key = stack.manage("tenant_create", f"bench-{uuid.uuid4().hex[:6]}").stdout.strip().splitlines()[-1]
        sdk = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)
        run_batch(sdk, texts[:64], "warm")
        seconds, _ = run_batch(sdk, texts, "e2e")
        results["e2e"] = len(texts) / seconds
        print(f"  end-to-end done: {results['e2e']:.1f} texts/s", flush=True)
        small = [run_batch(sdk, corpus(100, seed=100 + i), f"small{i}")[0] for i in range(n_small)]
        results["small_p50"] = statistics.median(small)
        results["small_p90"] = sorted(small)[int(0.9 * (len(small) - 1))]
    finally:
        stack.stop()
        if not args.embedded:
            with psycopg.connect(admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')

    e2e_vs_inprocess = results["e2e"] / results["inprocess"]
    e2e_vs_naive = results["e2e"] / results["direct_naive"]
    print()
    print(f"{'path':<48}{'texts/s':>10}{'vs in-process':>15}")
    print(f"{'(a) in-process MiniLM, length-sorted (ceiling)':<48}{results['inprocess']:>10.1f}{1.0:>15.2f}")
    print(
        f"{'(b) direct Triton, one text per request':<48}{results['direct_naive']:>10.1f}"
        f"{results['direct_naive'] / results['inprocess']:>15.2f}"
    )
    print(f"{'(c) end-to-end: upload → batch → output file':<48}{results['e2e']:>10.1f}{e2e_vs_inprocess:>15.2f}")
    print(
        f"(d) 100-line batch create→completed: p50 {results['small_p50']:.2f}s, p90 {results['small_p90']:.2f}s "
        f"({n_small} runs)"
    )
    print(
        f"    warm-up (register Triton, load the shipped models): {results['warm_s']:.1f}s; broker/db: "
        f"{'embedded SQLite + filesystem' if args.embedded else 'Postgres + Redis'}"
    )
    print(f"RATIOS e2e_vs_inprocess={e2e_vs_inprocess:.2f} e2e_vs_direct_naive={e2e_vs_naive:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
