"""Where the suite's CPU goes (the suite is CPU-bound on the 2-core host, so its wall time follows its
CPU seconds, not its sleeps). With ``SUITE_CPU_LOG=<dir>``, each pytest process (each xdist worker) appends one
JSON line per test to ``<dir>/<worker>.jsonl``: the test's wall seconds and the CPU seconds spent during it by the
worker and by the children it reaped (a stack's gunicorn, workers and tritonserver with its model stubs are
counted when they are stopped: a fixture's stack lands on the test whose teardown stopped it). Summarise with
``python scripts/suite_cpu.py <dir>``. Off (no hooks do anything) without the variable."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

_DIR = os.environ.get("SUITE_CPU_LOG", "")


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not _DIR:
        yield
        return
    wall, (own, children) = time.monotonic(), _cpu()
    yield
    own_after, children_after = _cpu()
    record = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - wall, 3),
        "own_cpu_s": round(own_after - own, 3),
        "children_cpu_s": round(children_after - children, 3),
        "ended": round(time.time(), 3),  # wall clock, comparable across workers: each worker's timeline
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(_DIR).mkdir(parents=True, exist_ok=True)
    with (Path(_DIR) / f"{worker}.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")
