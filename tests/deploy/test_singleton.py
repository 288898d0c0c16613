"""deploy/singleton.py against the real Postgres: one holder runs its command, a second copy waits until the
holder ends, then runs; without a Postgres URL it refuses to start."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.deploy.manifests import REPO

# The server of the suite's DATABASE_URL, on its always-present `postgres` database (the service's own
# database need not exist under test; the lock only needs a session).
_URL = urlsplit(os.environ.get("DATABASE_URL", ""))
DATABASE_URL = urlunsplit(_URL._replace(path="/postgres"))
pytestmark = pytest.mark.skipif(
    not _URL.scheme.startswith("postgres"), reason="the lock is a Postgres advisory lock: needs DATABASE_URL"
)


def _start(lock: str, marker: Path) -> subprocess.Popen[bytes]:
    # The command records that it ran, then stays up like beat does.
    command = [sys.executable, "-c", f"import pathlib, time; pathlib.Path({str(marker)!r}).touch(); time.sleep(60)"]
    return subprocess.Popen(
        [sys.executable, "-m", "deploy.singleton", "--lock", lock, "--poll", "0.2", "--", *command],
        cwd=REPO,
        env={**os.environ, "DATABASE_URL": DATABASE_URL},
    )


def _wait_for(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.1)
    return False


def test_only_one_copy_runs_and_the_next_takes_over(tmp_path):
    lock = f"test-beat-{os.getpid()}"
    first_ran, second_ran = tmp_path / "first", tmp_path / "second"
    first = _start(lock, first_ran)
    second = None
    try:
        assert _wait_for(first_ran, 30)
        second = _start(lock, second_ran)
        assert not _wait_for(second_ran, 2.0)  # ten of its polls: it is waiting for the lock
        first.terminate()  # forwarded to the child; the holder exits and its connection (the lock) ends
        first.wait(30)
        assert _wait_for(second_ran, 30)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)


def test_it_refuses_without_a_postgres_url():
    result = subprocess.run(
        [sys.executable, "-m", "deploy.singleton", "--lock", "x", "--database-url", "sqlite:///x", "--", "true"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Postgres" in result.stderr
