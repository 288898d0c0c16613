"""What following a batch costs it: `batchctl follow` downloading partial results (GET /v1/batches/{id}/output
and /errors every second) while the batch runs, against the same batch with nobody following.

Corpus: identity requests on `/v2/infer` (bench/hotpath.py's, one [1, 4] FP32 row per line: the model costs
nothing, so the control plane's own work, which a follower competes with, is what is timed). One stack (the
local runner, as `make serve` runs it); the runs alternate, without then with a follower, `--repeat` times, so
a drift of this host's speed falls on both. A batch's time is its own: created_at → completed_at. Early
dispatch is off (BATCH_EARLY_DISPATCH=0), so every run of the file gets the same shards.

With a follower, its file must equal the final output file as a set of lines, with no line twice.

Each run also prints the CPU seconds each process tree spent (web, shard worker, control worker, Triton, the
host's Postgres, and the follower itself): on a shared host the time ratio is noisy, while the extra CPU a
follower costs the stack is what it takes from the batch on a host whose cores the batch already fills.

The last line is machine-readable:
  FOLLOW lines=<n> duplicates=<lines in the follower's files more than once> slowdown=<median with ÷ median
         without - 1> alone_s=<median> followed_s=<median> same_lines=<true|false>
"""

from __future__ import annotations

import argparse
import io
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.hotpath import TERMINAL, Bench, corpus  # noqa: E402
from bench.proctrees import cpu_snapshot  # noqa: E402

BATCHCTL = Path(sys.executable).parent / "batchctl"


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)  # waited-for children: here, the followers
    return usage.ru_utime + usage.ru_stime


def run_batch(
    bench: Bench, content: bytes, lines: int, follow_to: Path | None, cpu: dict[str, float] | None = None
) -> tuple[float, int, bool]:
    """(the batch's seconds, duplicate lines, whether the follower's file equals the output file); ``cpu``
    receives each process tree's CPU seconds over the run."""
    pids = bench.pids() | {"triton": bench.stack.procs["triton"].pid}
    cpu_before = cpu_snapshot(pids) | {"follower": children_cpu_seconds()}
    file_id = bench.sdk.files.create(file=("follow.jsonl", io.BytesIO(content)), purpose="batch").id
    batch = bench.sdk.batches.create(input_file_id=file_id, endpoint="/v2/infer", completion_window="24h")
    follower = None
    if follow_to is not None:
        env = os.environ | {
            "BATCHCTL_API_KEY": bench.sdk.api_key,
            "BATCHCTL_BASE_URL": str(bench.sdk.base_url),
            # The checkout's batchctl, whichever checkout the venv's console script was installed from.
            "PYTHONPATH": str(REPO_ROOT),
        }
        command = [str(BATCHCTL), "follow", batch.id, "-o", str(follow_to), "--poll-interval", "1"]
        follower = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while (row := bench.batch_row(batch.id))["status"] not in TERMINAL:
        time.sleep(0.05)
    if row["status"] != "completed" or row["ok"] != lines:
        raise RuntimeError(f"batch {batch.id} ended {row['status']}: {row['ok']} ok, {row['failed']} failed")
    seconds = (row["completed"] - row["created"]).total_seconds()
    if follower is not None:
        _, stderr = follower.communicate(timeout=600)
    if cpu is not None:
        cpu_after = cpu_snapshot(pids) | {"follower": children_cpu_seconds()}
        cpu.update({name: cpu_after[name] - cpu_before[name] for name in cpu_after})
    if follower is None or follow_to is None:
        return seconds, 0, True
    if follower.returncode != 0:
        raise RuntimeError(f"batchctl follow exited {follower.returncode}: {stderr}")
    mine = follow_to.read_bytes().splitlines()
    final = bench.sdk.files.content(row["output"]).content.splitlines()
    return seconds, len(mine) - len(set(mine)), set(mine) == set(final) and len(mine) == len(final)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=2, help="pairs of runs (alone, followed)")
    args = parser.parse_args()
    # One shard plan for every run: early dispatch closes shards at validation's pace, which a loaded host changes
    # from run to run (measured 2026-12-02: 12 shards in one run, 308 in the next, of the same file).
    os.environ.setdefault("BATCH_EARLY_DISPATCH", "0")
    content = corpus(args.lines)
    bench = Bench(Path(tempfile.mkdtemp(prefix="bench-follow-")))
    alone: list[float] = []
    followed: list[float] = []
    duplicates = 0
    same = True
    try:
        bench.start()
        run_batch(bench, corpus(2_000), 2_000, None)  # warm-up: model loaded, caches filled
        for i in range(args.repeat):
            cpu_alone: dict[str, float] = {}
            cpu_followed: dict[str, float] = {}
            alone.append(run_batch(bench, content, args.lines, None, cpu_alone)[0])
            seconds, dup, equal = run_batch(
                bench, content, args.lines, bench.var_dir / f"followed-{i}.jsonl", cpu_followed
            )
            followed.append(seconds)
            duplicates += dup
            same = same and equal
            print(f"pair {i + 1}: alone {alone[-1]:.1f} s, followed {followed[-1]:.1f} s", flush=True)
            print(
                "  cpu s (alone/followed): "
                + ", ".join(f"{name} {cpu_alone[name]:.2f}/{cpu_followed[name]:.2f}" for name in cpu_followed),
                flush=True,
            )
    finally:
        bench.stop()
    a, f = statistics.median(alone), statistics.median(followed)
    print(f"\n{'lines':>8} {'alone s':>9} {'followed s':>11} {'followed/alone':>15}")
    print(f"{args.lines:>8} {a:>9.1f} {f:>11.1f} {f / a:>15.3f}")
    print(
        f"FOLLOW lines={args.lines} duplicates={duplicates} slowdown={f / a - 1:.3f} alone_s={a:.1f} "
        f"followed_s={f:.1f} same_lines={str(same).lower()}"
    )
    return 0 if same and duplicates == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
