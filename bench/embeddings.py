"""The embeddings hot path: can the control plane feed a GPU that embeds tens of thousands of texts a second?

`bench/hotpath.py` measures tensor lines through the `identity` model; this does the same for the
OpenAI-style `/v1/embeddings` lines that MiniLM serves, through `embed_stub` (triton_models/embed_stub: the
same interface, a fixed 384-d unit vector per text, no compute), so what is measured is the control plane's
own cost per embedding line: parse and check the text, pack calls, and encode 384 floats into each output
line. The frozen in-process reference is that per-line work in one Python thread with the standard `json`
module (parse the line, take the stub's vector, encode the OpenAI embedding response), measured in the
same run. Ends with one parseable line:

    HOTPATH_EMBEDDINGS lines=<n> e2e_lines_per_s=<x> inprocess_lines_per_s=<r> ratio=<x/r> ...

    .venv/bin/python bench/embeddings.py [--quick] [--sizes 10000,100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import numpy as np  # noqa: E402

from bench.hotpath import Bench, Run  # noqa: E402
from bench.run import corpus as texts_corpus  # noqa: E402

MODEL = "embed-stub"
# The catalogue row, its interface from the repository's config.pbtxt (as tests/e2e/test_autoscale.py does).
# Declared speed: a GPU-class model, ~10 µs a token, until the scheduler has measured it.
REGISTER = """
from controlplane.fleet.models import CatalogueModel
from controlplane.triton.client import repository_model_config
from django.conf import settings
c = repository_model_config(settings.TRITON_MODEL_REPOSITORY, "embed_stub")
t = lambda es: [{"name": e["name"], "datatype": e["data_type"].removeprefix("TYPE_"), "dims": [int(d) for d in e["dims"]]} for e in es]
CatalogueModel.objects.update_or_create(name="embed-stub", defaults=dict(
    triton_name="embed_stub", kind="embeddings", max_batch_size=int(c["max_batch_size"]), embedding_dimensions=384,
    inputs=[{"name": "TEXT", "datatype": "BYTES", "dims": [1]}], outputs=t(c["output"]),
    memory_per_instance_bytes=256 * 1024**2, load_seconds=2.0, max_instances=2,
    seconds_per_work_unit=0.00001))
"""


def embedding_line(i: int, text: str) -> bytes:
    return json.dumps(
        {"custom_id": f"e-{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": MODEL, "input": text}}
    ).encode()


def corpus(n: int) -> bytes:
    # bench/run.py's sentences (3-120 words, ~20 on average), cycled: the text does not change the cost here.
    texts = texts_corpus(min(n, 5000))
    return b"\n".join(embedding_line(i, texts[i % len(texts)]) for i in range(n)) + b"\n"


# -- the frozen in-process reference (do not optimise: it is the yardstick) ----------------------------


def inprocess_lines_per_s(content: bytes) -> float:
    vector = np.random.default_rng(384).standard_normal(384).astype(np.float32)
    vector /= np.linalg.norm(vector)
    lines = content.splitlines()
    started = time.perf_counter()
    out: list[bytes] = []
    for raw in lines:
        line = json.loads(raw)
        text = line["body"]["input"]
        tokens = len(text.split()) + 2
        body = {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector.tolist()}],
            "model": MODEL,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
        out.append(
            json.dumps(
                {"id": "batch_req_x", "custom_id": line["custom_id"], "response": {"status_code": 200, "body": body}}
            ).encode()
        )
    return len(lines) / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="10,000 and 50,000 lines (else 10,000 and 200,000)")
    parser.add_argument("--sizes", help="comma-separated line counts instead of the defaults")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the median is reported")
    args = parser.parse_args()
    sizes = [10_000, 50_000] if args.quick else [10_000, 200_000]
    if args.sizes:
        sizes = [int(n) for n in args.sizes.split(",")]
    print(f"embedding lines through {MODEL}; sizes {sizes}; cores {os.cpu_count()}", flush=True)
    corpora = {n: corpus(n) for n in sizes}

    def measure_reference() -> float:
        return max(inprocess_lines_per_s(corpora[sizes[0]]) for _ in range(3))

    bench = Bench(REPO_ROOT / "var" / "bench-embeddings")
    runs: list[Run] = []
    try:
        bench.start()
        stack = bench.stack
        stack.manage("shell", "-c", REGISTER)
        stack.manage("catalogue_warm", MODEL, "--min-instances", "1", "--actor", "bench")
        stack.warm_models = (MODEL,)
        stack.wait_warm()
        bench.run(corpus(1000), 1000, endpoint="/v1/embeddings")  # warm-up and the model's measured speed
        for n in sizes:
            repeats = []
            for _ in range(args.repeat):
                before = measure_reference()
                r = bench.run(corpora[n], n, endpoint="/v1/embeddings")
                r.reference = (before + measure_reference()) / 2
                repeats.append(r)
                print(f"  {n:>9,} lines: {r.lines_per_s:,.0f} lines/s end to end, ratio {r.ratio:.3f}", flush=True)
            repeats.sort(key=lambda run: run.ratio)
            runs.append(repeats[len(repeats) // 2])
    finally:
        bench.stop()

    print()
    print(f"{'lines':>10}{'e2e s':>9}{'lines/s':>10}{'vs in-proc':>11}{'validate':>9}{'run':>8}{'finalize':>9}")
    for r in runs:
        print(
            f"{r.lines:>10,}{r.e2e_s:>9.1f}{r.lines_per_s:>10,.0f}{r.ratio:>11.3f}{r.validating_s:>9.1f}"
            f"{r.in_progress_s:>8.1f}{r.finalizing_s:>9.1f}"
        )
    cpu_names = list(runs[-1].cpu)
    print(f"{'CPU s':>10}" + "".join(f"{name:>10}" for name in cpu_names) + f"{'µs/line':>9}")
    for r in runs:
        cells = "".join(f"{r.cpu[n]:>10.2f}" for n in cpu_names)
        print(f"{r.lines:>10,}{cells}{1e6 * sum(r.cpu.values()) / r.lines:>9.1f}")
    last = runs[-1]
    print(
        f"HOTPATH_EMBEDDINGS lines={last.lines} e2e_lines_per_s={last.lines_per_s:.0f} "
        f"inprocess_lines_per_s={last.reference:.0f} ratio={last.ratio:.3f} "
        f"in_progress_lines_per_s={last.lines / max(last.in_progress_s, 1e-9):.0f} "
        f"worker_peak_rss_mb={last.rss['worker'][1] / 2**20:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
