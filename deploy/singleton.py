"""Run one command while holding a Postgres advisory lock, so at most one copy of it runs across all hosts.

Celery beat must run once: two beats tick every schedule twice. Kubernetes' ``replicas: 1`` is not enough on
its own (a rolling update, or a node that stops answering while its pod still runs, gives two for a while),
so beat runs as ``python -m deploy.singleton --lock celery-beat -- celery -A controlplane beat …``
(deploy/k8s, deploy/compose). The lock is a session-level ``pg_try_advisory_lock`` on the service's own
database: a second copy waits until the first one's connection ends, and a holder that loses its connection
(Postgres restarted, network cut) stops its child and exits, because the lock went with the connection;
the orchestrator starts it again and it waits for the lock like any other copy.

Only psycopg and the standard library: this runs in the control plane image before Django is involved.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType

import psycopg

logger = logging.getLogger("deploy.singleton")


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_advisory_lock`` from a readable name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _connect(url: str) -> psycopg.Connection:
    # TCP keepalives: a holder cut off from Postgres notices within about a minute instead of the kernel's
    # two hours, and Postgres drops the dead session (and the lock) as fast.
    return psycopg.connect(
        url, autocommit=True, keepalives=1, keepalives_idle=20, keepalives_interval=10, keepalives_count=3
    )


def _alive(conn: psycopg.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def run(*, lock: str, command: list[str], database_url: str, poll_s: float) -> int:
    key = lock_key(lock)
    conn = _connect(database_url)
    announced = False
    while True:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is not None and row[0]:
            break
        if not announced:
            logger.info("lock %r is held elsewhere; waiting", lock)
            announced = True
        time.sleep(poll_s)
    logger.info("lock %r acquired; starting %s", lock, " ".join(command))
    child = subprocess.Popen(command)

    def forward(signum: int, _frame: FrameType | None) -> None:
        child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            return child.wait(timeout=poll_s)
        except subprocess.TimeoutExpired:
            pass
        if not _alive(conn):
            logger.error("lost the database connection and with it lock %r; stopping the child", lock)
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.singleton", description=__doc__.splitlines()[0])
    parser.add_argument("--lock", required=True, help="lock name, e.g. celery-beat")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL", ""))
    # How often a waiting copy retries and the holder checks its connection: a beat tick is 2 s, so a
    # takeover within ~5 s of the holder's end costs at most a couple of ticks.
    parser.add_argument("--poll", type=float, default=5.0)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("a command is required after --")
    if not args.database_url.startswith(("postgres://", "postgresql://")):
        parser.error("a Postgres DATABASE_URL is required (the lock is a Postgres advisory lock)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run(lock=args.lock, command=command, database_url=args.database_url, poll_s=args.poll)


if __name__ == "__main__":
    sys.exit(main())
