"""The local runner as an orchestrator: with supervise=True a crashed child is restarted with backoff and
the service keeps working; without it (the default, for tests that kill on purpose) nothing is restarted."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from deploy.local.stack import Stack, find_free_port
from tests.support.stack import assert_exactly_once, submit, tensor_lines
from tests.support.triton_fixture import pytest_runtest_makereport, triton_model_repository, triton_server

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(triton_server, tmp_path_factory) -> Iterator[Stack]:
    # Embedded defaults (SQLite, filesystem broker) in a var dir of its own, on the session's Triton.
    env = {
        "DATABASE_URL": "",
        "CELERY_BROKER_URL": "filesystem://",
        "STORAGE_BACKEND": "local",
        "SHARD_MAX_LINES": "16",
        "SHARD_LEASE_SECONDS": "3",
        "RESCUE_INTERVAL_SECONDS": "1",
    }
    var_dir = Path(tmp_path_factory.mktemp("supervised"))
    with Stack(
        var_dir=var_dir,
        web_port=find_free_port(),
        env=env,
        with_triton=False,
        triton_grpc_url=triton_server.grpc_url,
        supervise=True,
    ) as running:
        yield running


# How long a restart may take before the test calls the supervisor stuck: far above the 1-2 s backoffs, so a
# busy machine slows the test down instead of failing it.
RESTART_GIVE_UP_S = 60.0


def _crash(stack: Stack, name: str) -> int:
    """SIGKILL the child's process group behind the runner's back, as the OOM killer would."""
    pid = stack.procs[name].pid
    os.killpg(pid, signal.SIGKILL)
    return pid


def _wait_restarted(stack: Stack, name: str, old_pid: int, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        proc = stack.procs[name]
        if proc.pid != old_pid and proc.poll() is None:
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"{name} not restarted within {timeout_s}s; restarts: {stack.restarts}")


def _nice_of(pid: int) -> tuple[int, str | None]:
    """The process's niceness and its session's autogroup niceness (None: the kernel has no autogroups)."""
    autogroup = Path(f"/proc/{pid}/autogroup")
    group = autogroup.read_text().split()[-1] if autogroup.exists() else None
    return os.getpriority(os.PRIO_PROCESS, pid), group


def _past_the_wrapper(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until the child's ``sh -c '…; exec nice -n 10 …'`` wrapper has exec'd its command: until then the
    process is the shell at the runner's own niceness (a child the supervisor restarted a moment ago is)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if Path(argv[0].decode()).name not in ("sh", "nice"):
            return
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} still runs {argv[:3]} after {timeout_s}s")


def test_control_plane_children_yield_the_cpu_to_the_model_server(stack):
    assert stack.control_plane_nice == 10, "the runner's default"
    own = os.getpriority(os.PRIO_PROCESS, 0)  # nice -n adds to it; the autogroup value is absolute
    # A child that crashed while the stack started (a CI host at load 15 once lost the control worker at
    # start-up) is already back under a new pid: what is checked is the process running now.
    print(f"restarts before the crash tests: {stack.restarts}")
    for name, proc in stack.procs.items():
        _past_the_wrapper(proc.pid)
        nice, group = _nice_of(proc.pid)
        assert nice == min(19, own + 10), name
        assert group in (None, "10"), name  # plain nice alone would not reach across sessions
    assert os.getpriority(os.PRIO_PROCESS, 0) == own, "the runner itself (and Triton, started by it) is left alone"


def test_niced_leaves_the_command_alone_at_zero() -> None:
    from deploy.local.supervision import niced

    assert niced(["celery", "worker"], 0) == ["celery", "worker"]


def test_crashed_worker_and_beat_are_restarted_with_backoff_and_work_completes(stack):
    key = stack.manage("tenant_create", "supervised").stdout.strip().splitlines()[-1]
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=60)

    worker_pid, beat_pid = _crash(stack, "worker"), _crash(stack, "beat")
    # First crash in a row: restarted after the 1 s backoff. The supervisor's own record says which delay it
    # chose; the clock only bounds it from below (a loaded machine makes restarts later, never sooner), and the
    # generous wait is for a stuck supervisor, not a speed limit.
    first_wait = _wait_restarted(stack, "worker", worker_pid, timeout_s=RESTART_GIVE_UP_S)
    beat_wait = _wait_restarted(stack, "beat", beat_pid, timeout_s=RESTART_GIVE_UP_S)
    first = {r.name: r for r in stack.restarts}
    assert first["worker"].returncode == -signal.SIGKILL and first["worker"].delay_s == 1.0
    assert first["beat"].delay_s == 1.0
    assert first_wait >= 0.9, first_wait  # beat's wait starts after the worker's: it may be back already

    # A second crash soon after doubles the delay.
    worker_pid = _crash(stack, "worker")
    second_wait = _wait_restarted(stack, "worker", worker_pid, timeout_s=RESTART_GIVE_UP_S)
    assert stack.restarts[-1].name == "worker" and stack.restarts[-1].delay_s == 2.0 and second_wait >= 1.9
    print(
        f"restarts: worker {first_wait:.2f} s (backoff 1 s), beat {beat_wait:.2f} s, worker again {second_wait:.2f} s (2 s)"
    )

    # The restarted worker serves a batch end to end.
    lines = tensor_lines(64, prefix="sup")
    batch = submit(client, lines, endpoint="/v2/infer")
    deadline = time.monotonic() + 120
    while batch.status not in {"completed", "failed", "cancelled", "expired"} and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", (batch.status, batch.errors, stack.log_dir)
    output, errors = assert_exactly_once(client, batch, lines)
    assert len(output) == 64 and errors == []


def test_a_process_the_runner_kills_on_purpose_is_not_restarted(stack):
    killed_at = time.monotonic()
    stack.kill("control")
    time.sleep(1.6)
    # Restarts from before the kill (a start-up crash the supervisor rightly repaired) are not this test's.
    after = [r for r in stack.restarts if r.name == "control" and r.at >= killed_at]
    assert "control" not in stack.procs and after == [], after
    stack.start_control_worker()  # put it back for whatever runs next


def test_restart_backoff_doubles_per_crash_in_a_row_and_resets_after_a_healthy_run():
    from deploy.local.supervision import RESTART_HEALTHY_AFTER_S, RestartBackoff

    backoff = RestartBackoff(["worker"], now=0.0)
    assert [backoff.exited("worker", now=1.0 + i) for i in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    backoff.started("worker", now=100.0)
    assert backoff.exited("worker", now=100.0 + RESTART_HEALTHY_AFTER_S) == 1.0
