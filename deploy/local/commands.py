"""The command lines of the control plane's processes as the local runner (deploy/local/stack.py) starts them:
gunicorn, a Celery worker per queue, Celery beat. deploy/compose and deploy/k8s spell their own (the same workers
and queues, their own concurrency, beat behind deploy/singleton.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def gunicorn_command(port: int) -> list[str]:
    return [
        str(BIN / "gunicorn"),
        "controlplane.wsgi:application",
        "-b",
        f"127.0.0.1:{port}",
        # Two processes with a few threads: uploads and downloads stream, so threads mostly wait.
        "-w",
        "2",
        "--threads",
        "4",
        "--timeout",
        "300",
    ]


def celery_command(*, quiet: bool) -> list[str]:
    # No start-up banner in a JSON log: every line of it is one JSON object (controlplane/core/observability/logs.py).
    return [str(BIN / "celery"), "-A", "controlplane", *(["--quiet"] if quiet else [])]


def celery_worker_command(name: str, queues: str, concurrency: int, pool: str, *, quiet: bool) -> list[str]:
    return [
        *celery_command(quiet=quiet),
        "worker",
        "-l",
        "info",
        "-Q",
        queues,
        "-P",
        pool,
        "-c",
        str(concurrency),
        "-n",
        f"{name}-{os.getpid()}@%h",
        "--without-gossip",
        "--without-mingle",
    ]


def beat_command(schedule_path: Path, *, quiet: bool) -> list[str]:
    return [*celery_command(quiet=quiet), "beat", "-l", "info", "-s", str(schedule_path)]
