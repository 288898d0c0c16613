"""Consolidation on real tritonservers: a large model's batch completes only because another
model's instance was moved make-before-break to make room, with 0 failed lines during the move.

Two servers with one declared 256 MiB GPU each. Something else holds 100 MiB of triton0's GPU and the small
model (100 MiB) sits on triton1, so the large one (200 MiB) fits on neither GPU: 312 MiB are free in all, none
of it in one place. With both models' batches running, the planner moves the small model to triton0 (its new
instance ready before the old one goes) and loads the large one on triton1. `bench/placement.py --case defrag`
runs the same case on identity and scale2 and prints the DEFRAG line.

Both are sleeping models (triton_models/sleep_per_row and sleep_per_row_b, 20 ms a row, as GPU-bound models),
so the small model stays busy on its instance's time, not the host's CPU: the scenario fed identity 2,000-line
batches in 16-line shards before, 37 CPU-s and 150-580 s of wall that made it the suite's slowest test."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from deploy.local.fleet import local_fleet
from tests.e2e.test_placement import BROKER_URL, tensor_lines
from tests.support.stack import assert_exactly_once, register_sleeping_model, submit

pytestmark = pytest.mark.e2e

MIB = 1024**2
SMALL, LARGE = "sleep_per_row", "sleep_per_row_b"  # catalogue and Triton names alike
SETUP = f"""
from controlplane.fleet.models import CatalogueModel, Gpu, TritonServer
Gpu.objects.filter(server__name="triton0").update(used_by_others_bytes={100 * MIB})
CatalogueModel.objects.filter(triton_name="{SMALL}").update(
    memory_per_instance_bytes={100 * MIB}, max_instances=1, load_seconds=1.0,
    pin_server=TritonServer.objects.get(name="triton1"))
CatalogueModel.objects.filter(triton_name="{LARGE}").update(
    memory_per_instance_bytes={200 * MIB}, max_instances=1, load_seconds=1.0, seconds_per_work_unit=0.5)
"""
# Rows of one small-model batch: 8 s of its one instance in 25 16-row shards; a new batch goes in whenever the
# last one is half done, so the model is busy from before the large batch arrives until it has moved.
FEED_LINES = 400
UNPIN = "from controlplane.fleet.models import CatalogueModel; CatalogueModel.objects.update(pin_server=None)"


def _rows(db_url: str, query: str, *params) -> list[tuple]:
    """The query's rows; a Postgres that is out of connection slots for a moment (every suite on the host
    shares it) is asked again for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                return conn.execute(query, params).fetchall()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


def _wait_running(db_url: str, batch_id: str, timeout_s: float = 120) -> None:
    """Until the batch has a shard claimed: its model is busy from then on."""
    deadline = time.monotonic() + timeout_s
    query = "SELECT count(*) FROM batches_batchevent WHERE batch_id=%s AND kind='shard_claimed'"
    while time.monotonic() < deadline:
        if _rows(db_url, query, batch_id)[0][0]:
            return
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} never started")


def _half_done(db_url: str, batch_id: str) -> bool:
    """Half of the batch's shards (known once validation has planned them all) have finished."""
    query = (
        "SELECT b.status, count(s.id), count(s.id) FILTER (WHERE s.status='succeeded') FROM batches_batch b "
        "LEFT JOIN batches_shard s ON s.batch_id=b.id WHERE b.id=%s GROUP BY b.status"
    )
    status, shards, finished = _rows(db_url, query, batch_id)[0]
    return status != "validating" and finished * 2 >= shards


def _wait(client, ids: list[str], timeout_s: float = 900) -> list:
    """Until every batch is done. The limit only catches a hang (at load 20-30, with other suites beside it, the
    identity batches this scenario fed before took over 8 min); pytest-timeout (20 min) is the backstop."""
    from openai import InternalServerError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            batches = [client.batches.retrieve(b) for b in ids]
        except InternalServerError:  # a shared Postgres out of connections for a moment: poll again
            time.sleep(1.0)
            continue
        if all(b.status in ("completed", "failed", "cancelled", "expired") for b in batches):
            return batches
        time.sleep(0.5)
    raise AssertionError(f"batches not done: {[(b.id, b.status, b.request_counts) for b in batches]}")


def test_a_large_model_is_placed_by_moving_a_busy_one_with_no_failed_line(tmp_path: Path):
    from openai import OpenAI

    env = {
        "SHARD_MAX_LINES": "16",
        # Beat's control tasks every 2-3 s, not 1: on a loaded 2-core host faster ticks queue up ahead of
        # batch validation on the control worker.
        "FLEET_RECONCILE_INTERVAL_SECONDS": "3",
        "FLEET_HEARTBEAT_INTERVAL_SECONDS": "2",
        "FLEET_PAYBACK_HORIZON_SECONDS": "30",
        "FLEET_UNLOAD_GRACE_SECONDS": "1.5",
    }
    with local_fleet(tmp_path, servers=2, gpu_bytes=256 * MIB, env=env, broker_url=BROKER_URL) as fleet:
        for model in (SMALL, LARGE):
            register_sleeping_model(fleet.stack, name=model, triton=model, memory_bytes=100 * MIB, max_instances=1)
        fleet.stack.manage("shell", "-c", SETUP)
        client = OpenAI(base_url=f"{fleet.stack.base_url}/v1", api_key=fleet.api_key, max_retries=0, timeout=60)
        warm = submit(client, tensor_lines(32, SMALL, "warm"), endpoint="/v2/infer")
        _wait(client, [warm.id])
        fleet.stack.manage("shell", "-c", UNPIN)
        # The small model must be busy whenever the planner looks for room for the large one (an idle one is
        # evicted, not moved): rather than one batch sized for the slowest host, a new batch goes in whenever the
        # last one is half done, until the small model has moved.
        fed: list[tuple[str, list[dict]]] = []

        def feed() -> None:
            lines = tensor_lines(FEED_LINES, SMALL, f"small{len(fed)}")
            fed.append((submit(client, lines, endpoint="/v2/infer").id, lines))

        feed()
        _wait_running(fleet.db_url, fed[0][0])
        large = tensor_lines(300, LARGE, "large")  # 6 s on its one instance
        large_id = submit(client, large, endpoint="/v2/infer").id
        deadline = time.monotonic() + 600
        while not _rows(fleet.db_url, "SELECT 1 FROM fleet_placementevent WHERE action='move_out'"):
            assert time.monotonic() < deadline, "the small model never moved"
            if _half_done(fleet.db_url, fed[-1][0]):
                feed()
            time.sleep(0.5)
        done = _wait(client, [b for b, _ in fed] + [large_id])
        for batch, lines in zip(done, [lines for _, lines in fed] + [large], strict=True):
            assert batch.status == "completed" and batch.request_counts.failed == 0, batch.request_counts
            assert_exactly_once(client, batch, lines)
        # The move happened while the small model was serving: one of its shards ran across it.
        across = _rows(
            fleet.db_url,
            "SELECT count(*) FROM batches_shard s JOIN batches_batch b ON b.id=s.batch_id WHERE b.model=%s "
            "AND s.finished_at > (SELECT min(created_at) FROM fleet_placementevent WHERE action='move_out') "
            "AND b.created_at < (SELECT min(created_at) FROM fleet_placementevent WHERE action='move_in')",
            SMALL,
        )[0][0]
        assert across > 0, "the small model had no work left when it moved"
        every = _rows(
            fleet.db_url,
            "SELECT e.id, e.action, m.triton_name, coalesce(s.name, ''), e.ok, e.move_for, e.created_at, e.reason "
            "FROM fleet_placementevent e LEFT JOIN fleet_cataloguemodel m ON m.id=e.model_id "
            "LEFT JOIN fleet_tritonserver s ON s.id=e.server_id ORDER BY e.id",
        )
    # Every event (reasons and times included) is in the failure message: a wrong plan is told by its reasons.
    events = [e[:6] for e in every if e[1] in ("consolidate", "move_in", "move_out", "load")]
    history = "\n".join(f"{e[6]:%H:%M:%S.%f} {e[1]} {e[2]}@{e[3]} ok={e[4]} for={e[5]!r}: {e[7]}" for e in every)
    moves = [(a, m, s, ok, f) for _, a, m, s, ok, f in events if f]
    assert moves == [
        ("consolidate", LARGE, "", True, LARGE),
        ("move_in", SMALL, "triton0", True, LARGE),
        ("move_out", SMALL, "triton1", True, LARGE),
    ], history
    loads = [(i, s) for i, a, m, s, ok, _ in events if a == "load" and m == LARGE and ok]
    move_out = next(i for i, a, *_ in events if a == "move_out")
    # The large model was first loaded into the memory the move freed, after the small model's old instance went.
    assert loads and loads[0][1] == "triton1" and loads[0][0] > move_out, history
