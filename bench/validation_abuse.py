"""Validation abuse: a small tenant's batch while another tenant's huge file validates.

Scenario (identity model, rows of shape [1, 4] FP32 on `/v2/infer`, one local stack):
  * B alone: tenant B's 100-line batch on an idle service.
  * B under abuse: tenant A creates a batch of 400,000 lines (`--a-lines`); the moment it is validating (its
    validation took its turn: `validation_started_at` is set), B creates its 100-line batch.
B's time is `completed_at - created_at` of its batch, from the database. Each A batch then runs to its end, and
every line of A and B must be accounted for (completed or failed): `lost` counts the lines that are not.
Medians over `--runs` runs (3).

The last line is machine-readable:
  ABUSE b_slowdown=<B under abuse ÷ B alone, medians> lost=<lines of A and B not accounted for>
Target: b_slowdown ≤ 1.5, lost = 0. Each run's line shows B's create → in_progress (validation: its own queue and
process) and → first shard claim (behind A's shards, which early dispatch runs while A still validates); with
BATCH_EARLY_DISPATCH=0 in the environment A runs no shard before it is valid."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.fairness import B_LINES, TERMINAL, Db, tensor_jsonl  # noqa: E402

BROKER_URL = "redis://127.0.0.1:6379/7"


def _validating(db: Db, batch_id: str, timeout_s: float = 300) -> float:
    """Wait until the batch's validation took its turn; returns how long after its create that was."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        row = db.conn.execute(
            "SELECT status, validation_started_at - created_at FROM batches_batch WHERE id=%s", (batch_id,)
        ).fetchone()
        if row[0] != "validating":
            raise RuntimeError(f"batch {batch_id} left validating ({row[0]}) before B was created")
        if row[1] is not None:
            return row[1].total_seconds()
        time.sleep(0.005)
    raise RuntimeError(f"batch {batch_id} never started validating")


def _unaccounted(db: Db, batch_id: str) -> int:
    row = db.wait(batch_id, TERMINAL, 1800)
    if row["status"] != "completed":
        raise RuntimeError(f"batch {batch_id} ended {row['status']}")
    return row["total"] - row["completed"] - row["failed"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--a-lines", type=int, default=400_000, help="lines in A's file (default 400,000)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each (default 3); medians are reported")
    args = parser.parse_args()
    print(
        f"A: {args.a_lines} lines, B: {B_LINES} lines, identity [1, 4] FP32; {args.runs} runs; "
        f"cores: {os.cpu_count()}; load average at start: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    from openai import OpenAI

    from deploy.local.databases import migrated_database
    from deploy.local.stack import Stack, find_free_port

    var_dir = REPO_ROOT / "var" / "bench-validation-abuse"
    shutil.rmtree(var_dir, ignore_errors=True)
    with contextlib.ExitStack() as cleanup:
        db_url = cleanup.enter_context(migrated_database("cp_bench_abuse"))
        env = {
            "DATABASE_URL": db_url,
            "CELERY_BROKER_URL": BROKER_URL,
            # Its own keys on a shared Redis: nothing of another stack's queues is read or flushed.
            "CELERY_BROKER_KEY_PREFIX": f"abuse-{uuid.uuid4().hex[:8]}:",
        }
        stack = Stack(var_dir=var_dir, web_port=find_free_port(), env=env, warm_models=("identity",))
        cleanup.callback(stack.stop)
        stack.start()
        db = Db(db_url)
        cleanup.callback(db.conn.close)
        keys = {
            t: stack.manage("tenant_create", f"abuse-{t}-{uuid.uuid4().hex[:6]}").stdout.strip().splitlines()[-1]
            for t in ("a", "b")
        }
        sdk = {
            t: OpenAI(base_url=f"{stack.base_url}/v1", api_key=k, max_retries=0, timeout=600) for t, k in keys.items()
        }
        a_file = sdk["a"].files.create(file=("huge.jsonl", tensor_jsonl(args.a_lines, "a")), purpose="batch").id
        b_file = sdk["b"].files.create(file=("small.jsonl", tensor_jsonl(B_LINES, "b")), purpose="batch").id

        def create(tenant: str, file_id: str) -> str:
            return sdk[tenant].batches.create(input_file_id=file_id, endpoint="/v2/infer", completion_window="24h").id

        # Warm-up: the model's speed is measured and the processes' connections opened.
        db.wait(create("b", b_file), TERMINAL, 300)
        alone, abused, lost = [], [], 0
        for run in range(args.runs):
            b_id = create("b", b_file)
            lost += _unaccounted(db, b_id)
            alone.append(db.latency(b_id))
            alone_row = db.batch(b_id)
            alone_to_progress = (alone_row["in_progress_at"] - alone_row["created_at"]).total_seconds()
            alone_phases = db.phases(b_id)
            a_id = create("a", a_file)
            a_waited = _validating(db, a_id)
            b_id = create("b", b_file)
            lost += _unaccounted(db, b_id)
            abused.append(db.latency(b_id))
            abused_phases = db.phases(b_id)
            a_status_then = db.batch(a_id)["status"]
            _, to_progress, to_claim = db.b_timeline(a_id, b_id)
            lost += _unaccounted(db, a_id)
            a = db.batch(a_id)
            print(
                f"  run {run + 1}/{args.runs}: B alone {alone[-1]:.2f}s (in_progress after {alone_to_progress:.2f}s), "
                f"B while A validates {abused[-1]:.2f}s "
                f"(in_progress after {to_progress:.2f}s, first claim after {to_claim:.2f}s) "
                f"(A validating {a_waited:.2f}s after its create; A was {a_status_then} when B completed; "
                f"A validated in {(a['in_progress_at'] - a['created_at']).total_seconds():.1f}s, "
                f"done in {(a['completed_at'] - a['created_at']).total_seconds():.1f}s)",
                flush=True,
            )
            print(f"    B alone: {alone_phases}; B while A validates: {abused_phases}", flush=True)
    slowdown = statistics.median(abused) / statistics.median(alone)
    print(f"B alone {' '.join(f'{x:.2f}' for x in alone)}; while A validates {' '.join(f'{x:.2f}' for x in abused)}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print(f"ABUSE b_slowdown={slowdown:.2f} lost={lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
