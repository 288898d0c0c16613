"""The local runner's supervisor (deploy/local/stack.py starts it): the loop that restarts children that
exit, how long a crashed child waits before its restart, the var dir's signing key its children share, the
CPU priority they run at, and stopping them all together."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.core.env import SECRET_KEY_FILENAME

logger = logging.getLogger("deploy.local.stack")

# Restart backoff of a supervised child: 1 s, doubling per crash in a row, at most 30 s; a child that stayed
# up this long counts as healthy again, so its next crash restarts it after 1 s.
RESTART_FIRST_DELAY_S = 1.0
RESTART_MAX_DELAY_S = 30.0
RESTART_HEALTHY_AFTER_S = 60.0


@dataclass(frozen=True)
class Restart:
    """One supervised restart, as logged (the tests read these)."""

    name: str
    returncode: int | None
    delay_s: float
    at: float  # time.monotonic() of the restart


def secret_key_ensure(var_dir: Path) -> str:
    """The var dir's signing key, generated on first use: 67 random URL-safe characters, mode 0600.

    Created with O_EXCL, so two runners starting on one var dir at once end up with the same key."""
    path = var_dir / SECRET_KEY_FILENAME
    var_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_urlsafe(50) + "\n")
    return path.read_text().strip()


class RestartBackoff:
    """Per-child crash counts: the delay doubles per crash in a row and resets once a child stayed up."""

    def __init__(self, names: Iterable[str], now: float):
        self.crashes: dict[str, int] = {}
        self._started = dict.fromkeys(names, now)

    def exited(self, name: str, now: float) -> float:
        if now - self._started.get(name, now) >= RESTART_HEALTHY_AFTER_S:
            self.crashes[name] = 0
        self.crashes[name] = self.crashes.get(name, 0) + 1
        return min(RESTART_MAX_DELAY_S, RESTART_FIRST_DELAY_S * 2 ** (self.crashes[name] - 1))

    def started(self, name: str, now: float) -> None:
        self._started[name] = now


def supervise(
    procs: dict[str, subprocess.Popen[bytes]],
    lock: threading.RLock,
    stopping: threading.Event,
    respawn: Callable[[str], None],
    record: Callable[[Restart], None],
    *,
    log_dir: Path,
) -> None:
    """Restart children that exit, each on its own backoff, until ``stopping`` is set."""
    backoff = RestartBackoff(procs, time.monotonic())
    due: dict[str, tuple[float, float, int | None]] = {}  # name -> (restart at, delay, exit code)
    while not stopping.wait(0.2):
        now = time.monotonic()
        with lock:
            exited = [(n, p.returncode) for n, p in procs.items() if n not in due and p.poll() is not None]
        for name, code in exited:
            delay = backoff.exited(name, now)
            due[name] = (now + delay, delay, code)
            logger.warning("%s exited with code %s; restarting in %.0f s", name, code, delay)
        for name, (at, delay, code) in list(due.items()):
            if now < at or stopping.is_set():
                continue
            del due[name]
            try:
                respawn(name)
            except Exception:
                logger.exception("restarting %s failed", name)
                continue
            started = time.monotonic()
            backoff.started(name, started)
            record(Restart(name=name, returncode=code, delay_s=delay, at=started))
            logger.warning("restarted %s (restart %d in a row; log %s)", name, backoff.crashes[name], log_dir)


def terminate_together(
    procs: Sequence[subprocess.Popen[bytes]], *, timeout_s: float, leader_only: Collection[int] = ()
) -> None:
    """Stop children together: SIGTERM to each one's process group (the pids in ``leader_only``: to the
    process alone, e.g. Triton, which stops its own backend stubs), then one shared deadline for all of them,
    then SIGKILL to every group still there. One after another, each straggler cost its own wait (beat, web
    and three workers at 20 s each: 100 s to stop a stack)."""
    for proc in procs:
        if proc.poll() is None:
            _signal(proc.pid, signal.SIGTERM, group=proc.pid not in leader_only)
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal(proc.pid, signal.SIGKILL, group=True)
            proc.wait()


def _signal(pid: int, sig: int, *, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone already (and reaped: its group is empty)
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def niced(cmd: list[str], nice: int) -> list[str]:
    """``cmd`` at CPU niceness ``nice``. Each child starts its own session, and with the kernel's autogroup
    scheduling (on by default) a session is scheduled as one group: plain nice would only rank processes
    inside it, so the session's group gets the niceness too (where the kernel has autogroups). sh and nice
    exec: the pid stays the command's own."""
    if not nice:
        return cmd
    script = f'{{ echo {nice} > /proc/self/autogroup; }} 2>/dev/null; exec nice -n {nice} "$@"'
    return ["sh", "-c", script, "niced", *cmd]


# Run by the child's own interpreter before it becomes the command (exec keeps the parent-death signal).
_PDEATHSIG_EXEC = """
import ctypes, os, signal, sys
if ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM) != 0:  # PR_SET_PDEATHSIG
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
if os.getppid() != int(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGTERM)
os.execvp(sys.argv[2], sys.argv[2:])
"""


def dying_with_parent(cmd: Sequence[str]) -> list[str]:
    """``cmd`` made to get SIGTERM when its parent dies, even by SIGKILL or the OOM killer (Linux
    PR_SET_PDEATHSIG): no orphaned tritonserver holding ports, and no orphaned Celery worker of the local runner
    consuming the next stack's messages. Every child the runner starts gets it.

    A small interpreter (`python -S`) sets the signal and execs the command, so the pid stays the command's.
    It was a ``preexec_fn`` before: Python code in the forked child, which also runs the parent's at-fork
    handlers there, grpc's among them (a parent with gRPC channels: the runner, a pytest worker); under load
    such a child now and then died before its exec, its log holding only grpc's `epoll_wait error: Bad file
    descriptor` (docs/reliability.md). A plain fork and exec runs none.

    The signal fires when the *thread* that forked exits, not only the process: call Popen from a thread that
    lives as long as the child should (the main thread, the runner's supervisor or orchestrator loop, which
    end only when the runner stops its children anyway). The parent's pid is taken now, in the parent: if it
    died before the prctl, the child is already an orphan and ends itself at once."""
    return [sys.executable, "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *cmd]
