"""Placement follows demand across three real tritonserver processes.

Three servers with declared GPUs (256 MiB each; the models are declared at 64 MiB per instance), a flood
of batches for model A, then for model B. Placements must follow each shift while it runs, never exceed a
GPU's memory, and every line must complete with zero errors — including after one Triton process is
SIGKILLed mid-run.

A and B are sleeping models (triton_models/sleep_per_row and sleep_per_row_b: 20 ms per row, like a
GPU-bound model), so a shift's backlog is the models' time, not the host's CPU: 1,800 rows are 36 s on one
instance in 113 shards of 16 rows. The scenario used identity and scale2 in 4-line shards before, 1,350
shards whose claim, call and commit made it the suite's costliest module (225 CPU-s, docs/performance.md)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest

from deploy.local.fleet import local_fleet
from tests.support.stack import assert_exactly_once, register_sleeping_model, submit

pytestmark = pytest.mark.e2e

BROKER_URL = "redis://127.0.0.1:6379/12"
GPU_BYTES = 256 * 1024**2
INSTANCE_BYTES = 64 * 1024**2
MODEL_A, MODEL_B = "sleep_per_row", "sleep_per_row_b"  # catalogue and Triton names alike
LINES_PER_BATCH = 600  # three batches a shift: 1,800 rows of 20 ms, 36 s on one instance
RECONCILE_S = 2.0
# Placements must follow a shift's demand while the shift still runs: each growth is asserted to come before
# the shift's last batch completed, not within a fixed number of seconds (one reconcile interval, one model load
# and a dead server's detection take 10-25 s here, and a loaded host stretches them and the flood alike).


def tensor_lines(n: int, model: str, prefix: str) -> list[dict]:
    return [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v2/infer",
            "body": {
                "model": model,
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [float(i), 1.0, 2.0, 3.0]}],
            },
        }
        for i in range(n)
    ]


class Watcher(threading.Thread):
    """Samples placements every 0.25 s: instance counts per model over time, and memory per GPU."""

    def __init__(self, db_url: str):
        super().__init__(daemon=True)
        self.db_url = db_url
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.overcommits: list[str] = []
        self.errors: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._sample_until_stopped()
            except psycopg.Error as exc:  # a dropped connection: say so, reconnect, keep sampling
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.25)
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc} (the watcher stopped)")
                raise

    def _sample_until_stopped(self) -> None:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(
                    "SELECT m.triton_name, s.name, p.gpus, p.instances, m.memory_per_instance_bytes "
                    "FROM fleet_placement p JOIN fleet_cataloguemodel m ON m.id=p.model_id "
                    "JOIN fleet_tritonserver s ON s.id=p.server_id WHERE p.instances > 0 AND p.status='ready'"
                ).fetchall()
                totals: dict[str, int] = {}
                used: dict[tuple[str, str], int] = {}
                for model, server, gpus, instances, memory in rows:
                    totals[model] = totals.get(model, 0) + instances
                    for gpu in gpus.split(","):
                        used[(server, gpu)] = used.get((server, gpu), 0) + instances * memory
                self.overcommits += [f"{k}: {v}" for k, v in used.items() if v > GPU_BYTES]
                self.samples.append((time.monotonic(), totals))
                time.sleep(0.25)

    def first_time(self, after: float, predicate) -> float | None:
        for stamp, totals in self.samples:
            if stamp >= after and predicate(totals):
                return stamp - after
        return None


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    env = {
        # One Triton call a shard (the models' max_batch_size): 113 shards a shift.
        "SHARD_MAX_LINES": "16",
        "SHARD_LEASE_SECONDS": "3",
        "RESCUE_INTERVAL_SECONDS": "1",
        "FLEET_RECONCILE_INTERVAL_SECONDS": str(RECONCILE_S),
        "FLEET_HEARTBEAT_INTERVAL_SECONDS": "1",
        "FLEET_IDLE_TTL_SECONDS": "6",
        "FLEET_PAYBACK_HORIZON_SECONDS": "5",
        "FLEET_UNLOAD_GRACE_SECONDS": "1.5",
    }
    with local_fleet(
        Path(tmp_path_factory.mktemp("fleet")), servers=3, gpu_bytes=GPU_BYTES, env=env, broker_url=BROKER_URL
    ) as running:
        for model in (MODEL_A, MODEL_B):
            register_sleeping_model(
                running.stack, name=model, triton=model, memory_bytes=INSTANCE_BYTES, max_instances=4
            )
        yield running.stack, running.servers, running.db_url, running.api_key


def _wait_done(client, batch_ids: list[str], timeout_s: float = 600) -> list:
    # A guard against a hang, not a speed claim: at load 15 a shift of 2,700 lines took over 240 s here.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batches = [client.batches.retrieve(b) for b in batch_ids]
        if all(b.status in ("completed", "failed", "cancelled", "expired") for b in batches):
            return batches
        time.sleep(0.5)
    raise AssertionError(f"batches not done: {[(b.id, b.status, b.request_counts) for b in batches]}")


def test_placements_follow_demand_and_survive_a_dead_server(fleet):
    from openai import OpenAI

    stack, handles, db_url, key = fleet
    client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0, timeout=60)
    watcher = Watcher(db_url)
    watcher.start()
    try:
        # Shift 1: a flood for model A.
        a_lines = [tensor_lines(LINES_PER_BATCH, MODEL_A, f"a{b}") for b in range(3)]
        start_a, start_a_wall = time.monotonic(), time.time()
        a_batches = [submit(client, lines, endpoint="/v2/infer").id for lines in a_lines]
        grew_a = None
        deadline = time.monotonic() + 120
        while grew_a is None and time.monotonic() < deadline:
            grew_a = watcher.first_time(start_a, lambda t: t.get(MODEL_A, 0) >= 2)
            time.sleep(0.5)
        done_a = _wait_done(client, a_batches)
        for batch, lines in zip(done_a, a_lines, strict=True):
            assert batch.status == "completed" and batch.request_counts.failed == 0
            assert_exactly_once(client, batch, lines)

        # Shift 2: a flood for model B; A goes idle. Kill the first server that holds B mid-run.
        b_lines = [tensor_lines(LINES_PER_BATCH, MODEL_B, f"b{b}") for b in range(3)]
        start_b, start_b_wall = time.monotonic(), time.time()
        b_batches = [submit(client, lines, endpoint="/v2/infer").id for lines in b_lines]
        victim = None
        deadline = time.monotonic() + 60
        with psycopg.connect(db_url, autocommit=True) as conn:
            while victim is None and time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT s.name FROM fleet_placement p JOIN fleet_tritonserver s ON s.id=p.server_id "
                    "JOIN fleet_cataloguemodel m ON m.id=p.model_id WHERE m.triton_name=%s "
                    "AND p.status='ready' ORDER BY s.name LIMIT 1",
                    (MODEL_B,),
                ).fetchone()
                victim = row[0] if row else None
                time.sleep(0.2)
        assert victim is not None, f"{MODEL_B} was never placed"
        time.sleep(1.0)  # let shards run on it first
        handle = handles[int(victim.removeprefix("triton"))]
        os.killpg(handle.proc.pid, signal.SIGKILL)
        done_b = _wait_done(client, b_batches)
        for batch, lines in zip(done_b, b_lines, strict=True):
            assert batch.status == "completed" and batch.request_counts.failed == 0, batch.request_counts
            assert_exactly_once(client, batch, lines)
        shrank_a = None
        deadline = time.monotonic() + 60
        while shrank_a is None and time.monotonic() < deadline:
            shrank_a = watcher.first_time(start_b, lambda t: t.get(MODEL_A, 0) == 0)
            time.sleep(0.5)
        grew_b = watcher.first_time(start_b, lambda t: t.get(MODEL_B, 0) >= 2)
        served_b = watcher.first_time(start_b, lambda t: t.get(MODEL_B, 0) >= 1)
    finally:
        watcher.stop.set()
        watcher.join()
    assert watcher.is_alive() is False and watcher.samples, f"the watcher stopped: {watcher.errors}"
    print(f"\nwatcher: {len(watcher.samples)} samples, errors {watcher.errors}")

    # A shift's span: from its submission to its last batch's completed_at (whole seconds, hence the 1 s).
    span_a = max(b.completed_at for b in done_a) - start_a_wall + 1
    span_b = max(b.completed_at for b in done_b) - start_b_wall + 1
    assert grew_a is not None and grew_a <= span_a, (
        f"{MODEL_A} reached 2 instances after {grew_a}s, shift A {span_a:.0f}s"
    )
    assert served_b is not None and served_b <= span_b, (
        f"{MODEL_B} placed after {served_b}s, shift B {span_b:.0f}s; watcher errors {watcher.errors}"
    )
    assert grew_b is not None and grew_b <= span_b, (
        f"{MODEL_B} reached 2 instances after {grew_b}s, shift B {span_b:.0f}s"
    )
    # Idle A is released after its idle TTL (6 s) plus a reconcile interval.
    assert shrank_a is not None, f"idle {MODEL_A} was never unloaded"
    assert watcher.overcommits == [], watcher.overcommits[:5]
    with psycopg.connect(db_url, autocommit=True) as conn:
        state = conn.execute("SELECT state FROM fleet_tritonserver WHERE name=%s", (victim,)).fetchone()[0]
        left = conn.execute(
            "SELECT count(*) FROM fleet_placement p JOIN fleet_tritonserver s ON s.id=p.server_id WHERE s.name=%s",
            (victim,),
        ).fetchone()[0]
    assert state == "unhealthy" and left == 0
    print(
        f"\nPLACEMENT A>=2 after {grew_a:.1f}s, B serving after {served_b:.1f}s, >=2 after {grew_b:.1f}s, "
        f"A unloaded {shrank_a:.1f}s after the shift, shifts {span_a:.0f}s and {span_b:.0f}s, 0 failed lines, "
        f"victim {victim}"
    )
