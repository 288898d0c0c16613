from __future__ import annotations

import sys
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from controlplane.triton import local_server


class Command(BaseCommand):
    help = (
        "Run a local tritonserver (from the nvidia-pytriton wheel) in the foreground, in explicit model "
        "control mode on the repository's triton_models/. The control plane loads models on demand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--http-port", type=int, default=local_server.DEFAULT_HTTP_PORT)
        parser.add_argument("--grpc-port", type=int, default=local_server.DEFAULT_GRPC_PORT)
        parser.add_argument("--metrics-port", type=int, default=local_server.DEFAULT_METRICS_PORT)
        parser.add_argument("--host", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        argv = [
            "--model-repository", str(settings.TRITON_MODEL_REPOSITORY),
            "--http-port", str(options["http_port"]), "--grpc-port", str(options["grpc_port"]),
            "--metrics-port", str(options["metrics_port"]), "--host", options["host"],
        ]
        self.stdout.write(f"tritonserver: gRPC {options['host']}:{options['grpc_port']} (set TRITON_GRPC_URLS)")
        sys.exit(local_server.main(argv))
