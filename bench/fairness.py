"""Fairness benchmark: a small tenant's batch behind another tenant's flood, fair share vs FIFO.

Scenario (identity model, rows of shape [1, 4] FP32 on `/v2/infer`):
  * B alone: tenant B's 100-line batch on an idle service.
  * B under flood: tenant A creates a batch of 60,000 lines; once it is `in_progress` and a first shard of it
    has been claimed (so A really holds the model's slots), B creates its 100-line batch.
B's latency is `completed_at - created_at` of its batch, read from the database (no poll interval in it).
A's throughput is A's lines ÷ (A's `completed_at - in_progress_at`), from the flood runs that completed.

Each policy (SCHEDULER_POLICY=fair and fifo) has its own stack, both up at once: a fresh Postgres database,
its own Redis DB and tritonserver, same settings otherwise. Runs alternate between the two stacks (fair,
fifo, fifo, fair, …) so the host's drift falls on both alike. A's file is uploaded once per stack and each
run creates a new batch from it; runs are sequential (one A batch at a time, the idle stack only ticks its
beat), and each A batch runs to completion before the next run. Medians over `--runs` runs (5; 3 with
`--quick`).

The last line is machine-readable:
  FAIRNESS b_slowdown=<fair: B under flood ÷ B alone> fifo_b_slowdown=<same, FIFO>
           a_throughput_vs_fifo=<A's lines/s, fair ÷ FIFO>
Targets: b_slowdown ≤ 2.0 and a_throughput_vs_fifo ≥ 0.95."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402

# One Redis DB per policy's stack: both stacks are up at once.
BROKER_URLS = ("redis://127.0.0.1:6379/7", "redis://127.0.0.1:6379/6")
B_LINES = 100
TERMINAL = ("completed", "failed", "cancelled", "expired")


def tensor_jsonl(n: int, prefix: str) -> io.BytesIO:
    """n identity requests of one [1, 4] FP32 row each (the shape of tensor_line in tests/support/batches.py)."""
    return io.BytesIO(
        b"".join(
            json.dumps(
                {
                    "custom_id": f"{prefix}-{i}",
                    "method": "POST",
                    "url": "/v2/infer",
                    "body": {
                        "model": "identity",
                        "inputs": [
                            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [float(i), 1.0, 2.0, 3.0]}
                        ],
                    },
                }
            ).encode()
            + b"\n"
            for i in range(n)
        )
    )


@dataclass
class PolicyResult:
    policy: str
    b_alone: list[float] = field(default_factory=list)
    b_flood: list[float] = field(default_factory=list)
    a_lines_per_s: list[float] = field(default_factory=list)
    # Per flood run: A's shards, and how many of them were claimed after B's batch was created but before
    # B's shard was (what B waited behind), for the diagnosis table.
    a_shards: list[int] = field(default_factory=list)
    a_shard_seconds: list[float] = field(default_factory=list)
    a_claims_ahead_of_b: list[int] = field(default_factory=list)
    b_wait_to_in_progress: list[float] = field(default_factory=list)
    b_wait_to_claim: list[float] = field(default_factory=list)

    @property
    def slowdown(self) -> float:
        return statistics.median(self.b_flood) / statistics.median(self.b_alone)


class Db:
    """Reads of the stack's database: every timing comes from the rows, not from the client's clock."""

    def __init__(self, url: str):
        self.conn = psycopg.connect(url, autocommit=True)

    def batch(self, batch_id: str) -> dict:
        row = self.conn.execute(
            "SELECT status, created_at, in_progress_at, completed_at, total_lines, completed_lines, failed_lines "
            "FROM batches_batch WHERE id=%s",
            (batch_id,),
        ).fetchone()
        keys = ("status", "created_at", "in_progress_at", "completed_at", "total", "completed", "failed")
        return dict(zip(keys, row, strict=True))

    def seconds_per_row(self) -> float:
        """The identity model's measured seconds per work unit: shards of new batches are sized from it."""
        return self.conn.execute(
            "SELECT seconds_per_work_unit FROM fleet_cataloguemodel WHERE name='identity'"
        ).fetchone()[0]

    def claimed_shards(self, batch_id: str) -> int:
        return self.conn.execute(
            "SELECT count(*) FROM batches_batchevent WHERE batch_id=%s AND kind='shard_claimed'", (batch_id,)
        ).fetchone()[0]

    def wait(self, batch_id: str, statuses: tuple[str, ...], timeout_s: float, poll_s: float = 0.1) -> dict:
        # Polling the database, not the API: the API counts against the tenant's request rate, and a
        # 100 ms poll costs Postgres next to nothing on this 2-core host.
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            row = self.batch(batch_id)
            if row["status"] in statuses:
                return row
            time.sleep(poll_s)
        raise RuntimeError(f"batch {batch_id} still {row['status']} after {timeout_s:.0f}s")

    def latency(self, batch_id: str) -> float:
        row = self.batch(batch_id)
        if row["status"] != "completed" or row["failed"]:
            raise RuntimeError(f"batch {batch_id} ended {row['status']} with {row['failed']} failed lines")
        return (row["completed_at"] - row["created_at"]).total_seconds()

    def b_timeline(self, a_id: str, b_id: str) -> tuple[int, float, float]:
        """A's shards claimed between B's create and B's first claim; B's create→in_progress and
        create→first claim, in seconds."""
        b = self.batch(b_id)
        b_claim = self.conn.execute(
            "SELECT min(created_at) FROM batches_batchevent WHERE batch_id=%s AND kind='shard_claimed'", (b_id,)
        ).fetchone()[0]
        ahead = self.conn.execute(
            "SELECT count(*) FROM batches_batchevent WHERE batch_id=%s AND kind='shard_claimed' "
            "AND created_at > %s AND created_at < %s",
            (a_id, b["created_at"], b_claim),
        ).fetchone()[0]
        return (
            ahead,
            (b["in_progress_at"] - b["created_at"]).total_seconds(),
            (b_claim - b["created_at"]).total_seconds(),
        )

    def phases(self, batch_id: str) -> str:
        """Where a batch's time went, in seconds from its create: valid (in_progress), first claim, last shard
        committed, completed."""
        created, valid, done = self.conn.execute(
            "SELECT created_at, in_progress_at, completed_at FROM batches_batch WHERE id=%s", (batch_id,)
        ).fetchone()
        claimed, committed = self.conn.execute(
            "SELECT min(started_at), max(finished_at) FROM batches_shard WHERE batch_id=%s", (batch_id,)
        ).fetchone()
        marks = (("valid", valid), ("claim", claimed), ("run", committed), ("done", done))
        return " ".join(f"{name} {(at - created).total_seconds():.3f}" for name, at in marks if at is not None)

    def shard_stats(self, batch_id: str) -> tuple[int, float]:
        """The batch's shards and their mean run time (claim to commit), seconds."""
        count, mean = self.conn.execute(
            "SELECT count(*), avg(extract(epoch FROM finished_at - started_at)) FROM batches_shard WHERE batch_id=%s",
            (batch_id,),
        ).fetchone()
        return count, float(mean or 0.0)


class PolicyBench:
    """One policy's stack (its own Postgres database, Redis DB and tritonserver), its tenants and files."""

    def __init__(self, policy: str, *, broker_url: str, a_lines: int, var_dir: Path):
        self.policy, self.broker_url, self.a_lines = policy, broker_url, a_lines
        self.db_url = ""  # a copy of the migrated template while started (deploy/local/databases.py)
        self._database = contextlib.ExitStack()
        self.var_dir = var_dir / policy
        self.result = PolicyResult(policy)
        self.stack = None

    def start(self) -> None:
        from openai import OpenAI

        from deploy.local.databases import migrated_database
        from deploy.local.stack import Stack, find_free_port

        self.db_url = self._database.enter_context(migrated_database("cp_bench_fair"))
        redis.Redis.from_url(self.broker_url).flushdb()
        env = {"DATABASE_URL": self.db_url, "CELERY_BROKER_URL": self.broker_url, "SCHEDULER_POLICY": self.policy}
        # A fresh directory per run: the last run's logs stay for a look, its stored files do not pile up.
        shutil.rmtree(self.var_dir, ignore_errors=True)
        # Only identity is kept warm: an idle MiniLM stub would hold memory and nothing else here.
        self.stack = Stack(var_dir=self.var_dir, web_port=find_free_port(), env=env, warm_models=("identity",))
        self.stack.start()
        self.db = Db(self.db_url)
        keys = {}
        for tenant in ("a", "b"):
            keys[tenant] = (
                self.stack.manage("tenant_create", f"fair-{tenant}-{uuid.uuid4().hex[:6]}")
                .stdout.strip()
                .splitlines()[-1]
            )
        self.sdk_a = OpenAI(base_url=f"{self.stack.base_url}/v1", api_key=keys["a"], max_retries=0, timeout=300)
        self.sdk_b = OpenAI(base_url=f"{self.stack.base_url}/v1", api_key=keys["b"], max_retries=0, timeout=60)
        self.a_file = self.sdk_a.files.create(file=("flood.jsonl", tensor_jsonl(self.a_lines, "a")), purpose="batch").id
        self.b_file = self.sdk_b.files.create(file=("small.jsonl", tensor_jsonl(B_LINES, "b")), purpose="batch").id
        # Warm-up: the first shards measure the model's speed (shards are sized from it), and the first
        # requests warm gunicorn, the worker's connections and Triton's stub.
        warm_file = self.sdk_a.files.create(file=("warm.jsonl", tensor_jsonl(5000, "w")), purpose="batch").id
        self.db.wait(self._create(self.sdk_a, warm_file), TERMINAL, 300)
        self.db.wait(self._create(self.sdk_b, self.b_file), TERMINAL, 120)

    def _create(self, sdk, file_id: str) -> str:
        return sdk.batches.create(input_file_id=file_id, endpoint="/v2/infer", completion_window="24h").id

    def run_once(self, run: int, runs: int) -> None:
        db, result = self.db, self.result
        # B alone, on an idle service (the previous flood finished and was finalized).
        b_id = self._create(self.sdk_b, self.b_file)
        db.wait(b_id, TERMINAL, 120)
        result.b_alone.append(db.latency(b_id))
        # B under A's flood.
        speed = db.seconds_per_row()
        a_id = self._create(self.sdk_a, self.a_file)
        db.wait(a_id, ("in_progress", *TERMINAL), 300)
        while db.claimed_shards(a_id) == 0:
            time.sleep(0.02)
        b_id = self._create(self.sdk_b, self.b_file)
        db.wait(b_id, TERMINAL, 900)
        result.b_flood.append(db.latency(b_id))
        ahead, to_progress, to_claim = db.b_timeline(a_id, b_id)
        result.a_claims_ahead_of_b.append(ahead)
        result.b_wait_to_in_progress.append(to_progress)
        result.b_wait_to_claim.append(to_claim)
        a = db.wait(a_id, TERMINAL, 1800)
        if a["status"] != "completed" or a["failed"]:
            raise RuntimeError(f"flood batch {a_id} ended {a['status']} with {a['failed']} failed lines")
        result.a_lines_per_s.append(a["total"] / (a["completed_at"] - a["in_progress_at"]).total_seconds())
        shards, shard_seconds = db.shard_stats(a_id)
        result.a_shards.append(shards)
        result.a_shard_seconds.append(shard_seconds)
        print(
            f"  {self.policy} run {run + 1}/{runs}: B alone {result.b_alone[-1]:.2f}s, "
            f"B under flood {result.b_flood[-1]:.2f}s (in_progress after {to_progress:.2f}s, "
            f"first claim after {to_claim:.2f}s, {ahead} of A's shards claimed before it), "
            f"A {result.a_lines_per_s[-1]:.0f} lines/s in {shards} shards of {shard_seconds:.2f}s "
            f"(sized at {speed * 1e6:.0f} µs/row)",
            flush=True,
        )

    def stop(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.conn.close()
        if self.stack is not None:
            self.stack.stop()
        self._database.close()


def run_interleaved(order: list[str], *, a_lines: int, runs: int, var_dir: Path) -> dict[str, PolicyResult]:
    """Both stacks stay up and the runs alternate (fair, fifo, fifo, fair, …): run-to-run drift of this
    shared 2-core host (measured: ±10 % on A's lines/s between back-to-back stacks) then falls on both
    policies alike instead of on whichever stack ran second."""
    benches = [
        PolicyBench(policy, broker_url=BROKER_URLS[i], a_lines=a_lines, var_dir=var_dir)
        for i, policy in enumerate(order)
    ]
    try:
        for bench in benches:
            bench.start()
        for run in range(runs):
            for bench in benches if run % 2 == 0 else reversed(benches):
                bench.run_once(run, runs)
    finally:
        for bench in benches:
            bench.stop()
    return {bench.policy: bench.result for bench in benches}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="20,000 A lines and 3 runs per policy")
    parser.add_argument("--runs", type=int, help="runs per policy (default 5; 3 with --quick)")
    parser.add_argument("--a-lines", type=int, help="lines in A's flood (default 60,000; 20,000 with --quick)")
    parser.add_argument(
        "--policies", default="fair,fifo", help="which policy runs first in each pair of runs (the order alternates)"
    )
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 5)
    a_lines = args.a_lines or (20_000 if args.quick else 60_000)
    var_dir = REPO_ROOT / "var" / "bench-fairness"
    print(
        f"A: {a_lines} lines, B: {B_LINES} lines, identity [1, 4] FP32; {runs} runs per policy; "
        f"cores: {os.cpu_count()}; load average at start: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    order = args.policies.split(",")
    if sorted(order) != ["fair", "fifo"]:
        parser.error("--policies must name fair and fifo once each")
    results = run_interleaved(order, a_lines=a_lines, runs=runs, var_dir=var_dir)

    print()
    print(
        f"{'run':<10}{'policy':<8}{'B alone p50':>13}{'B under flood p50':>19}{'slowdown':>10}{'A lines/s':>11}"
        f"{'A shards':>10}{'A claims before B':>19}"
    )
    for r in results.values():
        print(
            f"{'quick' if args.quick else 'full':<10}{r.policy:<8}{statistics.median(r.b_alone):>12.2f}s"
            f"{statistics.median(r.b_flood):>18.2f}s{r.slowdown:>10.2f}{statistics.median(r.a_lines_per_s):>11.0f}"
            f"{statistics.median(r.a_shards):>10.0f}{statistics.median(r.a_claims_ahead_of_b):>19.0f}"
        )
    for r in results.values():
        print(
            f"  {r.policy}: B under flood create→in_progress p50 {statistics.median(r.b_wait_to_in_progress):.2f}s, "
            f"create→first claim p50 {statistics.median(r.b_wait_to_claim):.2f}s; "
            f"B alone runs {' '.join(f'{x:.2f}' for x in r.b_alone)}; "
            f"under flood {' '.join(f'{x:.2f}' for x in r.b_flood)}"
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    fair, fifo = results["fair"], results["fifo"]
    a_ratio = statistics.median(fair.a_lines_per_s) / statistics.median(fifo.a_lines_per_s)
    print(
        f"FAIRNESS b_slowdown={fair.slowdown:.2f} fifo_b_slowdown={fifo.slowdown:.2f} "
        f"a_throughput_vs_fifo={a_ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
