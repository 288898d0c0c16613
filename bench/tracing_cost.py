"""What tracing costs the hot path (docs/ARCHITECTURE.md, "Tracing"): the identity corpus of bench/hotpath.py on
two stacks side by side, one with tracing off (the embedded default: no OTEL_EXPORTER_OTLP_ENDPOINT) and one
with every batch traced (OTEL_EXPORTER_OTLP_ENDPOINT to an OTLP receiver in this process, the default
parentbased_always_on sampler, Triton in OpenTelemetry trace mode), batches alternating off/on so the host's
drift falls on both alike. Both stacks are up for the whole run; only one batch runs at a time.

  .venv/bin/python bench/tracing_cost.py [--lines 100000] [--repeat 5]

Prints each pair, the medians and the spans received, and ends with one parseable line:
  TRACING lines=<n> off_lines_per_s=<median> on_lines_per_s=<median> ratio=<on ÷ off> run_ratio=<in_progress
          lines/s on ÷ off> spans_per_batch=<spans received ÷ traced batches> load=<1-min load at the end>
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.hotpath import Bench, Run, corpus  # noqa: E402
from tests.otlp_receiver import OtlpReceiver  # noqa: E402


def _key_prefix() -> dict[str, str]:
    return {"CELERY_BROKER_KEY_PREFIX": f"bench-trace-{uuid.uuid4().hex[:6]}:"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5, help="off/on pairs; medians are reported")
    args = parser.parse_args()
    print(f"identity [1, 4] FP32, {args.lines:,} lines; cores {os.cpu_count()}; load {os.getloadavg()[0]:.2f}")
    content = corpus(args.lines)
    receiver = OtlpReceiver().start()
    var_dir = REPO_ROOT / "var" / "bench-tracing"
    off = Bench(var_dir / "off", env=_key_prefix())
    traced_env = {**_key_prefix(), "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "LOCAL_TRITON_TRACING": "1"}
    on = Bench(var_dir / "on", env=traced_env, flush_broker=False)
    pairs: list[tuple[Run, Run]] = []
    try:
        off.start()
        on.start()
        for bench in (off, on):
            bench.run(corpus(1000), 1000)  # warm-up, as bench/hotpath.py
        time.sleep(2.0)
        spans_before = len(receiver.spans)
        for i in range(args.repeat):
            # Alternate which goes first: a drift within a pair falls on each side equally often.
            first, second = (off, on) if i % 2 == 0 else (on, off)
            runs = {id(first): first.run(content, args.lines), id(second): second.run(content, args.lines)}
            pair = (runs[id(off)], runs[id(on)])
            pairs.append(pair)
            print(
                f"  pair {i + 1}: off {pair[0].lines_per_s:,.0f} lines/s, on {pair[1].lines_per_s:,.0f} lines/s "
                f"(on/off {pair[1].lines_per_s / pair[0].lines_per_s:.3f}; run phase "
                f"{pair[0].in_progress_s:.2f} s / {pair[1].in_progress_s:.2f} s)",
                flush=True,
            )
        time.sleep(3.0)  # the last spans' export interval (the SDK's 5 s default batches them)
        spans = len(receiver.spans) - spans_before
    finally:
        for bench in (on, off):
            bench.stop()
        receiver.stop()

    off_rate = statistics.median(pair[0].lines_per_s for pair in pairs)
    on_rate = statistics.median(pair[1].lines_per_s for pair in pairs)
    off_run = statistics.median(args.lines / pair[0].in_progress_s for pair in pairs)
    on_run = statistics.median(args.lines / pair[1].in_progress_s for pair in pairs)
    pair_ratios = [pair[1].lines_per_s / pair[0].lines_per_s for pair in pairs]
    print()
    print(f"{'':>22}{'off':>12}{'on':>12}{'on/off':>9}")
    print(f"{'end to end, lines/s':>22}{off_rate:>12,.0f}{on_rate:>12,.0f}{on_rate / off_rate:>9.3f}")
    print(f"{'run phase, lines/s':>22}{off_run:>12,.0f}{on_run:>12,.0f}{on_run / off_run:>9.3f}")
    print(f"pairs' on/off: {', '.join(f'{r:.3f}' for r in pair_ratios)}; median {statistics.median(pair_ratios):.3f}")
    print(f"spans received for {len(pairs)} traced batches: {spans} ({spans / len(pairs):.0f} per batch)")
    load = os.getloadavg()[0]
    print(f"load average at end: {load:.2f}")
    print(
        f"TRACING lines={args.lines} off_lines_per_s={off_rate:.0f} on_lines_per_s={on_rate:.0f} "
        f"ratio={on_rate / off_rate:.3f} run_ratio={on_run / off_run:.3f} "
        f"spans_per_batch={spans / len(pairs):.0f} load={load:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
