"""What tracing costs the hot path (docs/architecture/tracing.md, "Traces"): the identity corpus of bench/hotpath.py on
one traced stack (OTEL_EXPORTER_OTLP_ENDPOINT to an OTLP receiver in this process, the default
parentbased_always_on sampler, Triton in OpenTelemetry trace mode), batches alternating traced and untraced.
Which one a batch is, is decided as production decides it, at the create request: each create sends a W3C
`traceparent` with the sampled flag set or clear, which Django's instrumentation continues and the
parent-based sampler follows for every later span of the batch. Side by side on one stack, so the host's drift
(and its other load) falls on both alike.

An untraced batch here still pays the non-recording context handling (~3 µs per shard and per call, measured
in process); with no endpoint at all there is none of that, so the on/off ratio here slightly understates the
difference to the embedded default. Triton's own tracing (rate 1) applies to both: it does not read our flag.

  .venv/bin/python bench/tracing_cost.py [--lines 20000] [--repeat 3]

Prints each pair, the medians and the spans received per traced batch, and ends with one parseable line:
  TRACING lines=<n> off_lines_per_s=<median> on_lines_per_s=<median> ratio=<on ÷ off> run_ratio=<in_progress
          lines/s on ÷ off> spans_per_batch=<spans received ÷ traced batches> load=<1-min load at the end>
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.hotpath import Bench, Run, corpus  # noqa: E402
from tests.support.otlp_receiver import OtlpReceiver  # noqa: E402


def traceparent(*, sampled: bool) -> dict[str, str]:
    return {"traceparent": f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{'01' if sampled else '00'}"}


def span_cpu_us(calls: int = 2000) -> tuple[float, float]:
    """CPU µs per Triton-call span in this process, traced (a shard span with ``calls`` call spans, batched
    and OTLP-encoded as the exporter would, the encoding counted) and untraced: what the worker pays per call."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from controlplane.core.observability import tracing

    class Encoding(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    def per_call() -> float:
        started = time.process_time()
        with tracing.batch_span("shard.run", traceparent=parent, attributes={"shard.index": 0}):
            for _ in range(calls):
                with tracing.outgoing("triton.infer", attributes={"model": "identity", "server": "x", "rows": 64}):
                    pass
        tracing.tracing_flush()
        return (time.process_time() - started) / calls * 1e6

    tracing.tracing_configure(service_name="bench", exporter=Encoding())
    with tracing.span("batch.create"):
        parent = tracing.current_traceparent()
    traced = min(per_call() for _ in range(5))
    tracing.tracing_configure(service_name="", exporter=None)
    untraced = min(per_call() for _ in range(5))
    return traced, untraced


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3, help="untraced/traced pairs; medians are reported")
    args = parser.parse_args()
    print(f"identity [1, 4] FP32, {args.lines:,} lines; cores {os.cpu_count()}; load {os.getloadavg()[0]:.2f}")
    traced_us, untraced_us = span_cpu_us()
    print(
        f"CPU per Triton call in process: traced {traced_us:.1f} µs (span, batching, OTLP encoding), off {untraced_us:.1f} µs"
    )
    content = corpus(args.lines)
    receiver = OtlpReceiver().start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "LOCAL_TRITON_TRACING": "1"}
    bench = Bench(REPO_ROOT / "var" / "bench-tracing", env=env)
    pairs: list[tuple[Run, Run]] = []
    traced_spans = 0
    try:
        bench.start()
        bench.run(corpus(1000), 1000)  # warm-up, as bench/hotpath.py
        for i in range(args.repeat):
            # Alternate which goes first: a drift within a pair falls on each side equally often.
            order = (False, True) if i % 2 == 0 else (True, False)
            runs: dict[bool, Run] = {}
            for sampled in order:
                before = len(receiver.spans)
                runs[sampled] = bench.run(content, args.lines, headers=traceparent(sampled=sampled))
                if sampled:
                    time.sleep(6.0)  # the SDK's and Triton's 5 s export interval: count this batch's spans
                    traced_spans += len(receiver.spans) - before
            pair = (runs[False], runs[True])
            pairs.append(pair)
            print(
                f"  pair {i + 1}: off {pair[0].lines_per_s:,.0f} lines/s, on {pair[1].lines_per_s:,.0f} lines/s "
                f"(on/off {pair[1].lines_per_s / pair[0].lines_per_s:.3f}; run phase "
                f"{pair[0].in_progress_s:.2f} s / {pair[1].in_progress_s:.2f} s)",
                flush=True,
            )
    finally:
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
    print(f"spans received for {len(pairs)} traced batches: {traced_spans} ({traced_spans / len(pairs):.0f} per batch)")
    load = os.getloadavg()[0]
    print(f"load average at end: {load:.2f}")
    print(
        f"TRACING lines={args.lines} off_lines_per_s={off_rate:.0f} on_lines_per_s={on_rate:.0f} "
        f"ratio={on_rate / off_rate:.3f} run_ratio={on_run / off_run:.3f} "
        f"spans_per_batch={traced_spans / len(pairs):.0f} load={load:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
