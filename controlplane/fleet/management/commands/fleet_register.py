from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import IntegrityError

from controlplane.fleet.inventory import server_register

# Binary units: a "16G" card reports 16 GiB. "B"/"iB" suffixes are accepted and mean the same.
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?$")


def parse_size(text: str) -> int:
    """'512M' / '16G' / '1.5T' / '17179869184' → bytes; ValueError on anything else."""
    match = _SIZE.match(text.strip().upper())
    if not match:
        raise ValueError(f"{text!r} is not a size (use bytes or a number with K, M, G or T, e.g. 16G)")
    size = int(float(match.group(1)) * _UNITS[match.group(2)])
    if size <= 0:
        raise ValueError(f"{text!r}: a GPU needs some memory")
    return size


class Command(BaseCommand):
    help = (
        "Register (or update) a Triton server and its GPUs for the placement loop. On CPU hosts the GPUs are "
        "declared (--gpu-memory); with --real-gpus and --metrics-url the heartbeat measures them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="e.g. triton-0")
        parser.add_argument("grpc_url", help="host:port of Triton's gRPC endpoint")
        parser.add_argument(
            "--gpu-memory",
            required=True,
            help="memory of each GPU, comma-separated, in index order: 16G,16G (or 512M, bytes)",
        )
        parser.add_argument(
            "--metrics-url", default="", help="Triton's Prometheus endpoint, e.g. http://h:8002/metrics"
        )
        parser.add_argument("--real-gpus", action="store_true", help="run instances as KIND_GPU on these GPUs")

    def handle(
        self, *args: Any, name: str, grpc_url: str, gpu_memory: str, metrics_url: str, real_gpus: bool, **options: Any
    ) -> None:
        try:
            sizes = [parse_size(part) for part in gpu_memory.split(",")]
        except ValueError as exc:
            raise CommandError(f"--gpu-memory: {exc}") from exc
        try:
            server = server_register(
                name=name, grpc_url=grpc_url, gpu_memory_bytes=sizes, metrics_url=metrics_url, real_gpus=real_gpus
            )
        except IntegrityError as exc:
            raise CommandError(f"{grpc_url} is already registered under another name") from exc
        gpus = ", ".join(f"gpu{i} {size / 1024**3:.1f} GiB" for i, size in enumerate(sizes))
        kind = "real GPUs" if real_gpus else "declared GPUs"
        self.stdout.write(f"Registered {server.name} at {server.grpc_url} with {len(sizes)} {kind}: {gpus}.")
