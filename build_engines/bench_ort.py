"""Benchmark the CPU half of the pipeline for one spec (default MiniLM): how long export and verify take,
and ONNX Runtime vs torch throughput at the spec's opt shape.

    .venv/bin/python build_engines/bench_ort.py [--spec minilm] [--repeats 20]

torch and ONNX Runtime calls alternate, so background load on a shared machine hits both alike; the
figure reported is the median per-batch latency.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `build_engines` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import numpy as np

from build_engines.export import export_onnx, onnx_path
from build_engines.model_io import load_source, random_inputs
from build_engines.spec import load_spec
from build_engines.verify import verify_onnx


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="minilm")
    parser.add_argument("--repeats", type=int, default=20, help="timed batches per runtime")
    args = parser.parse_args()

    import onnxruntime as ort
    import torch

    spec = load_spec(args.spec)
    sizes = spec.profile["opt"]
    with tempfile.TemporaryDirectory(prefix="bench_ort_") as tmp:
        out = Path(tmp)
        started = time.perf_counter()
        export_onnx(spec, out, command="bench_ort.py")
        export_s = time.perf_counter() - started
        started = time.perf_counter()
        summary = verify_onnx(spec, out, command="bench_ort.py", seed=0, echo=lambda _: None)
        verify_s = time.perf_counter() - started

        model = load_source(spec)
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(onnx_path(out)), options, providers=["CPUExecutionProvider"])
        feeds = random_inputs(spec, sizes, np.random.default_rng(0))
        torch_feeds = {name: torch.from_numpy(array) for name, array in feeds.items()}
        names = [t.name for t in spec.outputs]

        def run_torch() -> None:
            with torch.inference_mode():
                model(**torch_feeds)

        def run_ort() -> None:
            session.run(names, feeds)

        timings: dict[str, list[float]] = {"torch (eager, fp32)": [], "onnxruntime CPU (fp32)": []}
        runners = dict(zip(timings, (run_torch, run_ort), strict=True))
        for runner in runners.values():  # warm-up: first calls allocate and pick kernels
            runner()
            runner()
        for _ in range(args.repeats):
            for label, runner in runners.items():
                tick = time.perf_counter()
                runner()
                timings[label].append(time.perf_counter() - tick)

    batch = next(iter(feeds.values())).shape[0]
    shape = "x".join(str(d) for d in next(iter(feeds.values())).shape)
    print(
        f"{spec.name}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), onnxruntime {ort.__version__}, "
        f"load average {os.getloadavg()[0]:.1f} (other processes share these CPUs)"
    )
    print(f"\n{'stage':<28} {'seconds':>8}")
    print(f"{'export (torch -> ONNX)':<28} {export_s:>8.1f}")
    print(
        f"{'verify (min/opt/max+corpus)':<28} {verify_s:>8.1f}   max_abs {summary['max_abs']:.2e}, "
        f"min_cos {summary['min_cosine']:.7f}"
    )
    print(f"\nthroughput at opt shape {shape}, median of {args.repeats} batches")
    print(f"{'runtime':<24} {'ms/batch':>9} {'rows/s':>8} {'vs torch':>9}")
    torch_ms = statistics.median(timings["torch (eager, fp32)"]) * 1000
    for label, samples in timings.items():
        ms = statistics.median(samples) * 1000
        print(f"{label:<24} {ms:>9.1f} {batch / ms * 1000:>8.1f} {torch_ms / ms:>8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
