"""The chaos suite's stack: its own Postgres, Redis and tritonserver processes, so it may kill them.

One stack per run of the package (scenarios run one after another on it, each leaving it healthy for the
next): gunicorn, the Celery workers (a prefork shard worker among them) and beat from
deploy.local.stack.Stack, over a throwaway Postgres cluster and `redis-server --save ""` on free ports
(tests/chaos/services.py), with the runner's own Triton registered as the managed server, so a Triton
restart goes through the heartbeat and the reconciler as in production. Product defaults throughout (leases, rescue, heartbeat, reconcile),
except: small shards (many per batch), a 20 s completion window to exercise expiry, and the expiry check
every 2 s instead of 30 s so that scenario stays short. Nothing supervises the children: the suite kills
on purpose and restarts what it killed itself.

`CHAOS_FULL=1` (make chaos) picks the full profile: 20 worker kills, a 90 s Triton outage, a 60 s pause.
Figures go to var/chaos/results-<profile>.{json,md} and the terminal summary, the last run's process logs
to var/chaos/logs/."""

from __future__ import annotations

import contextlib
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.stack import Stack, find_free_port
from tests.chaos.harness import GEN_MODEL, MODEL, PROFILE, RESULTS_DIR, TENANTS, Chaos, Recorder
from tests.chaos.services import ThrowawayPostgres, ThrowawayRedis

_recorders: list[Recorder] = []
LOG_DIR = RESULTS_DIR / "logs"


@pytest.fixture(scope="package")
def recorder() -> Recorder:
    rec = Recorder(PROFILE)
    _recorders.append(rec)
    return rec


@pytest.fixture(scope="package")
def chaos_stack() -> Iterator[Chaos]:
    pg, broker = ThrowawayPostgres(), ThrowawayRedis()
    stack: Stack | None = None
    try:
        pg.init()
        pg.start()
        broker.start()
        db_url = pg.create_database("controlplane")
        env = {
            "DATABASE_URL": db_url,
            "CELERY_BROKER_URL": broker.url(0),
            "SHARD_MAX_LINES": "50",
            "BATCH_COMPLETION_WINDOWS": "24h,20s",
            "EXPIRY_INTERVAL_SECONDS": "2",
        }
        var_dir = Path(tempfile.mkdtemp(prefix="chaos-stack-"))
        stack = Stack(var_dir=var_dir, web_port=find_free_port(), env=env, warm_models=(MODEL, GEN_MODEL))
        stack.start()
        # Several tenants, so concurrent batches share the slots (fair share) instead of queueing by age.
        script = "from controlplane.tenants.services import tenant_create\n"
        script += "".join(f"print(tenant_create(name='chaos-{t}')[1])\n" for t in TENANTS)
        keys = stack.manage("shell", "-c", script).stdout.split()[-len(TENANTS) :]
        chaos = Chaos(stack, db_url, dict(zip(TENANTS, keys, strict=True)), pg, broker)
        yield chaos
        chaos.close()
    finally:
        try:
            if stack is not None:
                _stop(stack, pg, broker)
        finally:
            broker.destroy()
            pg.destroy()


def _stop(stack: Stack, pg: ThrowawayPostgres, broker: ThrowawayRedis) -> None:
    try:
        with contextlib.suppress(KeyError, ProcessLookupError):
            stack.signal("triton", signal.SIGCONT)  # a paused Triton ignores SIGTERM
        stack.stop()
    finally:
        # The logs outlive the run (the last run's, for a post-mortem); the stack's data does not.
        shutil.rmtree(LOG_DIR, ignore_errors=True)
        with contextlib.suppress(OSError):
            shutil.copytree(stack.log_dir, LOG_DIR, dirs_exist_ok=True)
            shutil.copy(pg.log, LOG_DIR / "postgres.log")
            shutil.copy(broker.log, LOG_DIR / "redis.log")
        shutil.rmtree(stack.var_dir, ignore_errors=True)


@pytest.fixture
def chaos(chaos_stack: Chaos) -> Iterator[Chaos]:
    """The shared stack, healthy at the start of each scenario whatever the previous one left."""
    chaos_stack.heal()
    yield chaos_stack


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for rec in _recorders:
        if rec.rows:
            terminalreporter.write_sep("-", f"chaos figures ({rec.profile.name}) -> {rec.md_path}")
            terminalreporter.write_line(rec.markdown())
