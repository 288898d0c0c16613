from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.http.errors import DomainError
from controlplane.fleet.membership.join_leave import server_join

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
        "Register (or update: the same call again changes nothing) a Triton server and its GPUs. With "
        "--metrics-url the GPUs are read from Triton's metrics (nv_gpu_memory_total_bytes per GPU); on CPU hosts "
        "they are declared (--gpu-memory-gib 16 16, or --gpu-memory 16G,16G). Same as POST /internal/fleet/servers."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        # NAME and HOST:PORT may also come positionally (the original form: fleet_register NAME HOST:PORT).
        parser.add_argument("name_arg", nargs="?", metavar="NAME")
        parser.add_argument("grpc_url_arg", nargs="?", metavar="HOST:PORT")
        parser.add_argument("--name", help="e.g. triton-0 (a pod name)")
        parser.add_argument("--grpc-url", help="host:port of Triton's gRPC endpoint")
        parser.add_argument("--http-url", default="", help="http://host:port of Triton's HTTP endpoint")
        parser.add_argument(
            "--metrics-url", default="", help="Triton's Prometheus endpoint, e.g. http://h:8002/metrics"
        )
        parser.add_argument("--pool", default="default", help="the kind of GPU node (fleet-size pools)")
        parser.add_argument("--gpu-memory-gib", type=float, nargs="+", default=[], help="declared GPUs' memory")
        parser.add_argument("--gpu-memory", help="declared GPUs as sizes, comma-separated: 16G,16G")
        parser.add_argument("--real-gpus", action="store_true", help="run instances as KIND_GPU on these GPUs")
        parser.add_argument(
            "--force",
            action="store_true",
            help="move a server that is live (healthy heartbeat, old address answering) to new addresses",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"] or options["name_arg"]
        grpc_url = options["grpc_url"] or options["grpc_url_arg"]
        if not name or not grpc_url:
            raise CommandError("--name and --grpc-url are required")
        sizes = [int(g * 1024**3) for g in options["gpu_memory_gib"]]
        if any(size <= 0 for size in sizes):
            raise CommandError("--gpu-memory-gib: a GPU needs some memory")
        if options["gpu_memory"] is not None:
            try:
                sizes += [parse_size(part) for part in options["gpu_memory"].split(",")]
            except ValueError as exc:
                raise CommandError(f"--gpu-memory: {exc}") from exc
        try:
            server, created = server_join(
                name=name,
                grpc_url=grpc_url,
                http_url=options["http_url"],
                metrics_url=options["metrics_url"],
                pool=options["pool"],
                gpu_memory_bytes=sizes,
                real_gpus=options["real_gpus"],
                actor="fleet_register",
                force=options["force"],
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        gpus = ", ".join(f"gpu{g.index} {g.total_memory_bytes / 1024**3:.1f} GiB" for g in server.gpus.all())
        kind = "real GPUs" if server.real_gpus else "declared GPUs"
        verb = "Registered" if created else "Updated"
        self.stdout.write(
            f"{verb} {server.name} at {server.grpc_url} in pool {server.pool} with "
            f"{server.gpus.count()} {kind}: {gpus}."
        )
