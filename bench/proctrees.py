"""What a benchmark's process trees cost: peak resident memory (sampled) and CPU seconds (from /proc), per
tree — a prefork worker is a parent and its children — plus the host's Postgres and Redis by name.
Linux only (reads /proc)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree_rss_bytes(pid: int) -> tuple[int, int]:
    """(sum over the process tree, largest single process) of resident memory."""
    total = largest = 0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    total += rss
                    largest = max(largest, rss)
        except OSError:
            continue
        stack += _children(current)
    return total, largest


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process tree (exited processes no longer count)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (stat fields 14 and 15)
        except (OSError, IndexError, ValueError):
            continue
        stack += _children(current)
    return total


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """User + system CPU seconds of a live process tree per thread name ("process/thread", from comm): which
    threads of a server (its gRPC threads, a backend's stub) spent them."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[str, float] = {}
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            process = Path(f"/proc/{current}/comm").read_text().strip()
            for task in Path(f"/proc/{current}/task").glob("*"):
                name = f"{process}/{(task / 'comm').read_text().strip()}"
                fields = (task / "stat").read_text().rpartition(")")[2].split()
                found[name] = found.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
        stack += _children(current)
    return found


def services_cpu_seconds() -> dict[str, float]:
    """CPU seconds of the host's Postgres and Redis processes (not children of the stack), by command name."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {"postgres": 0.0, "redis": 0.0}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, _, rest = stat.read_text().rpartition(")")
            name = head.partition("(")[2]
            fields = rest.split()
            key = "postgres" if name.startswith("postgres") else "redis" if name.startswith("redis") else None
            if key:
                found[key] += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return found


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    return {name: tree_cpu_seconds(pid) for name, pid in pids.items()} | services_cpu_seconds()


class RssSampler:
    """Peak resident memory per named process tree: the tree's sum and its largest single process (a
    prefork worker is a parent and its children; the issue's 400 MB bound is per process)."""

    def __init__(self, pids: dict[str, int], interval_s: float = 0.2):
        self.pids, self.interval_s = pids, interval_s
        self.peak = dict.fromkeys(pids, 0)
        self.peak_process = dict.fromkeys(pids, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, pid in self.pids.items():
                total, largest = tree_rss_bytes(pid)
                self.peak[name] = max(self.peak[name], total)
                self.peak_process[name] = max(self.peak_process[name], largest)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
