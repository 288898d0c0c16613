"""Throwaway Postgres and Redis server processes the chaos suite may kill and restart.

Started from the installed binaries on free ports, each in a fresh directory under /tmp, so killing them
touches nothing else on the machine (the shared services on 5432 and 6379 keep running for other suites).
A restart keeps the port and the data directory: clients see what production sees when a database or a
broker restarts in place. Plain Python, no pytest, no Django: the fixtures and a REPL can both drive them.

initdb refuses to run as root, so as root the cluster is created and run as the `postgres` user
(`runuser`), in a directory that user owns; the socket goes to that directory too, not /var/run.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import redis

from deploy.local.triton_server import free_port

PG_BIN = Path(os.environ.get("CHAOS_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = os.environ.get("CHAOS_REDIS_SERVER", shutil.which("redis-server") or "redis-server")


class ServiceError(RuntimeError):
    """A throwaway server could not be created, started or stopped."""


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ThrowawayPostgres:
    """One cluster: `start()`, `stop(mode)`, `restart()`, `destroy()`; `url(db)` for clients."""

    def __init__(self, port: int | None = None, *, user: str = "postgres") -> None:
        self.port = port or free_port()
        self.user = user
        self.root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self._as_user = os.geteuid() == 0
        if self._as_user:
            shutil.chown(self.root, user, user)

    def _run(self, *cmd: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        full = ["runuser", "-u", self.user, "--", *cmd] if self._as_user else list(cmd)
        result = subprocess.run(full, capture_output=True, text=True, timeout=timeout, cwd=self.root)
        if result.returncode != 0:
            raise ServiceError(f"{' '.join(cmd)} failed:\n{result.stdout}{result.stderr}\n{_tail(self.log)}")
        return result

    def init(self) -> ThrowawayPostgres:
        # --no-sync: a throwaway cluster need not survive a power cut, only its server process dying.
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        return self

    def start(self) -> None:
        # fsync=off costs nothing a process crash could expose (the kernel keeps what was written) and keeps
        # this shared 2-core machine's disk quiet; synchronous_commit stays on, so an immediate stop loses
        # no commit a client was told about.
        # log_lock_waits: a wait past deadlock_timeout (1 s) is logged with who holds the lock, so a slow call in a
        # scenario can be told from a lock in the logs the suite keeps (var/chaos/logs/postgres.log).
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
            " -c log_lock_waits=on"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60", "start"
        )

    def stop(self, mode: str = "fast") -> None:
        """`immediate` is a crash (every backend dies at once, recovery on the next start); `fast` a clean
        shutdown that disconnects clients."""
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "immediate") -> float:
        """Stop (a crash by default) and start again on the same port and data. Returns the monotonic time
        at which it accepted connections again."""
        self.stop(mode)
        self.start()
        return time.monotonic()

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def destroy(self) -> None:
        """Stop whatever runs and delete the directory; never raises (teardown)."""
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(Exception):
            if pid_file.exists():  # pg_ctl could not stop it: the postmaster's process group goes
                os.killpg(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


class ThrowawayRedis:
    """`redis-server --save ""`: a restart loses every message, as a broker without persistence does."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.root = Path(tempfile.mkdtemp(prefix="chaos-redis-"))
        self.log = self.root / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self, timeout_s: float = 20) -> float:
        """Start on the same port; returns the monotonic time it answered PING."""
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", str(self.root), "--logfile", str(self.log)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise ServiceError(f"redis-server exited with {self.proc.returncode}:\n{_tail(self.log)}")
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return time.monotonic()
                time.sleep(0.05)
        finally:
            client.close()
        raise ServiceError(f"redis-server on {self.port} not answering after {timeout_s}s:\n{_tail(self.log)}")

    def kill(self) -> None:
        """SIGKILL: every queued and unacknowledged message is gone."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> float:
        self.kill()
        return self.start()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def queued(self, queue: str = "control") -> list[tuple[str, list]]:
        """(task name, args) of each message waiting on a queue (Celery's Redis transport: one list per queue)."""
        out = []
        for raw in redis.Redis(port=self.port).lrange(queue, 0, -1):
            envelope = json.loads(raw)
            args = json.loads(base64.b64decode(envelope["body"]))[0]
            out.append((envelope["headers"]["task"], args))
        return out
