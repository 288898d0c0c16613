"""How often does a traced tritonserver continue the W3C traceparent a call carries? Starts the local server in
OpenTelemetry trace mode (deploy/local/triton_server.trace_args) with an in-process OTLP receiver, sends
``calls`` identity infers from ``threads`` threads, each with a fresh traceparent, and counts Triton's
InferRequest spans that continue it against those that start a root trace of their own.

    python scripts/triton_trace_probe.py [--protocol grpc|http] [--threads N] [--calls N] [--repeat-lost]

``--repeat-lost`` sends the traceparents that were not continued once more (docs/architecture/tracing.md,
"Known limits").
Ends with one line: ``TRACE_PROBE protocol=grpc threads=1 calls=300 continued=… roots=… lost_continued_on_resend=…``.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from deploy.local.triton_server import DEFAULT_MODEL_REPOSITORY, running_local_server, trace_args
from tests.support.otlp_receiver import OtlpReceiver

EXPORT_WAIT_S = 8.0  # Triton's batching span processor exports every 5 s by default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeat-lost", action="store_true")
    args = parser.parse_args()
    if args.protocol == "grpc":
        import tritonclient.grpc as client_module
    else:
        import tritonclient.http as client_module

    receiver = OtlpReceiver().start()
    server_args = ("--exit-timeout-secs=5", "--load-model=identity", *trace_args(receiver.endpoint))
    log_path = Path(tempfile.mkdtemp(prefix="trace-probe-")) / "triton.log"
    try:
        with running_local_server(DEFAULT_MODEL_REPOSITORY, log_path=log_path, extra_args=server_args) as server:
            url = server.grpc_url if args.protocol == "grpc" else server.http_url.removeprefix("http://")
            client = client_module.InferenceServerClient(url)
            rows = np.ones((16, 4), dtype=np.float32)

            def call(parent: tuple[str, str]) -> None:
                tensor = client_module.InferInput("INPUT0", list(rows.shape), "FP32")
                tensor.set_data_from_numpy(rows)
                client.infer("identity", [tensor], headers={"traceparent": f"00-{parent[0]}-{parent[1]}-01"})

            def send(parents: list[tuple[str, str]]) -> set[str]:
                """The span ids among ``parents`` that an InferRequest span continued."""
                receiver.spans.clear()
                with ThreadPoolExecutor(args.threads) as pool:
                    list(pool.map(call, parents))
                time.sleep(EXPORT_WAIT_S)
                wanted = dict((span_id, trace_id) for trace_id, span_id in parents)
                return {
                    span.parent_id
                    for span in list(receiver.spans)
                    if span.name == "InferRequest" and wanted.get(span.parent_id) == span.trace_id
                }

            parents = [(secrets.token_hex(16), secrets.token_hex(8)) for _ in range(args.calls)]
            continued = send(parents)
            lost = [parent for parent in parents if parent[1] not in continued]
            resent = len(send(lost)) if args.repeat_lost and lost else 0
    finally:
        receiver.stop()
    print(
        f"TRACE_PROBE protocol={args.protocol} threads={args.threads} calls={args.calls} "
        f"continued={len(continued)} roots={len(lost)} lost_continued_on_resend={resent}"
    )


if __name__ == "__main__":
    main()
