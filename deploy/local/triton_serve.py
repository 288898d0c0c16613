"""Run the local tritonserver (from the nvidia-pytriton wheel) in the foreground, in explicit model control
mode on the repository's triton_models/. Nothing is loaded at start: the control plane loads models.

    python -m deploy.local.triton_serve --http-port 8010 --grpc-port 8011 --metrics-port 8012

Not a manage.py command: the runtime package (controlplane/) must not import the local runner (deploy/).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from deploy.local.triton_server import (
    DEFAULT_BACKEND_CACHE,
    DEFAULT_GRPC_PORT,
    DEFAULT_HTTP_PORT,
    DEFAULT_METRICS_PORT,
    DEFAULT_MODEL_REPOSITORY,
    start_local_server,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    # The same variable and default as settings.TRITON_MODEL_REPOSITORY, read without importing Django.
    parser.add_argument(
        "--model-repository", default=os.environ.get("TRITON_MODEL_REPOSITORY") or str(DEFAULT_MODEL_REPOSITORY)
    )
    parser.add_argument("--http-port", type=int, default=DEFAULT_HTTP_PORT)
    parser.add_argument("--grpc-port", type=int, default=DEFAULT_GRPC_PORT)
    parser.add_argument("--metrics-port", type=int, default=DEFAULT_METRICS_PORT)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind; 0.0.0.0 exposes it to the network")
    parser.add_argument("--log-path", default=None, help="append server output here (default: stdout)")
    parser.add_argument("--backend-dir", default=None, help=f"default: {DEFAULT_BACKEND_CACHE}")
    parser.add_argument("extra", nargs="*", help="extra tritonserver args, after --")
    args = parser.parse_args(argv)

    proc = start_local_server(
        args.model_repository,
        args.http_port,
        args.grpc_port,
        args.metrics_port,
        args.log_path,
        args.extra,
        backend_dir=Path(args.backend_dir) if args.backend_dir else None,
        die_with_parent=True,
        host=args.host,
    )
    grpc_url = f"{args.host}:{args.grpc_port}"
    print(
        f"tritonserver: gRPC {grpc_url}. Put it under management with `manage.py fleet_register local "
        f"{grpc_url} --gpu-memory 16G`, or run unmanaged with TRITON_GRPC_URLS={grpc_url}.",
        flush=True,
    )

    def forward(signum: int, _frame: object) -> None:
        # Triton handles SIGINT/SIGTERM itself by draining; we just pass the signal on and keep waiting.
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
