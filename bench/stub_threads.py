"""Where tinylm's python-backend stub spends its CPU, per thread, against the same engine in this process.

A tritonserver of its own serves tinylm alone (no control plane); the corpus goes over one gRPC stream as the
shard worker sends it (one non-streamed response per line). Before and after each round the CPU seconds of
every thread of the stub are read from /proc/<stub>/task/<tid>/stat. The engine's step loop names itself
(`cb-engine`); the stub's main thread (tid = pid) runs
`execute`; the rest keep the stub's name (the busy one is the stub-to-parent thread that carries each
`is_cancelled()` to tritonserver). The same prompts then run through the engine in this process, timed by
`time.thread_time`. Rounds alternate. Compare CPU seconds: the wall-time ratio is the scheduler's as much as
the path's (tritonserver runs in a session, hence a scheduler autogroup, of its own).

    .venv/bin/python bench/stub_threads.py [--lines 256] [--repeat 3] [--py-spy]

Prints each round's threads and a `STUB` line: CPU milliseconds per completion token, stub vs in process.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.generation import InProcess, mixed_corpus  # noqa: E402  (puts the engine's folder on sys.path)
from controlplane.triton.client import TritonClient  # noqa: E402
from controlplane.triton.streaming import GenerationRequest, GenerationStream  # noqa: E402
from deploy.local.triton_server import running_local_server  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def tid_cpu_seconds(pid: int) -> dict[int, tuple[str, float]]:
    """Per thread of one process: (name from comm, user + system CPU seconds)."""
    found = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rpartition(")")[2].split()
            found[int(task.name)] = ((task / "comm").read_text().strip(), (int(fields[11]) + int(fields[12])) / TICK)
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended between listing and reading
    return found


def stub_pid(server_pid: int) -> int:
    """The python-backend stub serving tinylm: a child of tritonserver whose command line names the model."""
    for task in Path(f"/proc/{server_pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            if b"tinylm" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise RuntimeError("no tinylm stub under tritonserver")


def role(pid: int, tid: int, name: str) -> str:
    if tid == pid:
        return "main (execute)"
    # The engine's step loop names itself (cb-engine); the stub's own threads keep its process name.
    return f"stub thread {tid - pid:+d}" if name.startswith("triton_python") else name


def through_stub(url: str, prompts: list[str], max_tokens: list[int]) -> int:
    """Send every prompt at once, as one shard does; completion tokens made."""
    tokens = 0
    with GenerationStream(url, "tinylm") as stream:
        for i, (prompt, limit) in enumerate(zip(prompts, max_tokens, strict=True)):
            params = {"max_tokens": limit, "temperature": 0}
            stream.submit(GenerationRequest(f"r{i}-{time.monotonic_ns()}", prompt, params))
        for response in stream.responses(timeout_s=600):
            if response.error is not None:
                raise RuntimeError(str(response.error))
            tokens += sum(response.num_output_tokens or [])
    return tokens


# Functions whose share of a thread's samples (inclusive) says where the stub's time goes beside the forward.
WATCHED = (
    "KVPool._run",
    "KVPool.decode",
    "KVPool.prefill",
    "pick_tokens",
    "Engine._append",
    "Engine._notify",
    "_Stream.on_update",
    "_Stream._response",
    "Engine._finish",
    "Engine._admit",
    "Engine._start",
    "Engine.step",
    "TritonPythonModel.execute",
    "Engine.submit",
)


def print_profile(raw: Path) -> None:
    """Per Python thread of the stub: its samples and the functions (any frame) that most of them pass through."""
    per_thread: collections.Counter[str] = collections.Counter()
    frames: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *rest = stack.split(";")
        per_thread[thread] += int(count)
        for frame in set(f.split(" (")[0] for f in rest):
            frames[thread][frame] += int(count)
    for thread, total in per_thread.most_common():
        shown = [(name, frames[thread][name]) for name in WATCHED if frames[thread][name]]
        top = ", ".join(f"{name} {n / total:.1%}" for name, n in shown)
        print(f"  {thread}: {total} samples; {top}")


def start_py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """Sampled without stopping the stub (--nonblocking), so it is not slowed by the sampling."""
    spy = REPO_ROOT / ".venv" / "bin" / "py-spy"
    command = [spy, "record", "--pid", str(pid), "--format", "raw", "--threads", "--nonblocking", "--rate", "200"]
    process = subprocess.Popen([*command, "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)  # attached
    return process


def stub_round(
    url: str, pid: int, prompts: list[str], limits: list[int], spy_out: Path | None
) -> tuple[int, float, float]:
    """One corpus through the stub, its threads' CPU printed; (tokens, wall seconds, CPU seconds)."""
    load = os.getloadavg()[0]
    spy = start_py_spy(pid, spy_out) if spy_out else None
    before, wall = tid_cpu_seconds(pid), time.perf_counter()
    tokens = through_stub(url, prompts, limits)
    wall, after = time.perf_counter() - wall, tid_cpu_seconds(pid)
    if spy and spy_out:
        spy.send_signal(signal.SIGINT)
        spy.wait()
        print_profile(spy_out)
    spent = {tid: after[tid][1] - before.get(tid, ("", 0.0))[1] for tid in after}
    total = sum(spent.values())
    print(f"stub: {tokens} tokens in {wall:.2f} s wall, {total:.2f} s CPU, load {load:.1f}")
    for tid in sorted(spent, key=lambda t: -spent[t]):
        if spent[tid] > 0:
            print(f"  {role(pid, tid, after[tid][0]):24} {spent[tid]:7.2f} s  {spent[tid] / total:6.1%}")
    return tokens, wall, total


def inprocess_round(inprocess: InProcess, prompts: list[str], limits: list[int]) -> tuple[int, float, float]:
    """The same prompts through the engine in this thread (no background thread); (tokens, wall, CPU)."""
    from cb_sampling import SamplingParams

    engine = inprocess.cached
    engine.prefix_cache.evict(engine.prefix_cache.held_tokens)  # cold, as a new batch on the server
    params = [SamplingParams(max_tokens=m, temperature=0.0) for m in limits]
    cpu, wall = time.thread_time(), time.perf_counter()
    requests = engine.generate(prompts, params)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    tokens = sum(len(c.token_ids) for r in requests for c in r.choices)
    print(f"in process: {tokens} tokens in {wall:.2f} s wall, {cpu:.2f} s CPU (tokenizing the prompts included)")
    return tokens, wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--py-spy", action="store_true", help="profile the stub's Python threads each round")
    args = parser.parse_args()
    inprocess = InProcess()
    lines = mixed_corpus(args.lines)
    prompts, limits = inprocess.prompts(lines), [line.max_tokens for line in lines]
    log = Path(tempfile.mkdtemp()) / "tritonserver.log"
    stub_ms, local_ms, speed = [], [], []
    with running_local_server(log_path=log) as server:
        client = TritonClient(server.grpc_url, timeout_s=120.0)
        client.ensure_loaded("tinylm")
        pid = stub_pid(server.proc.pid)
        through_stub(server.grpc_url, prompts[:8], limits[:8])  # warm-up
        print(next((ln for ln in log.read_text().splitlines() if "tinylm torch:" in ln), "(no torch line)"))
        for round_ in range(args.repeat):
            print(f"round {round_ + 1}")
            spy_out = log.parent / f"spy{round_}.txt" if args.py_spy else None
            tokens, stub_wall, stub_cpu = stub_round(server.grpc_url, pid, prompts, limits, spy_out)
            local, local_wall, local_cpu = inprocess_round(inprocess, prompts, limits)
            stub_ms.append(stub_cpu / tokens * 1000)
            local_ms.append(local_cpu / local * 1000)
            speed.append(local_wall / stub_wall)  # as vs_inprocess: stub tokens/s over in-process tokens/s
        client.close()
    mid = args.repeat // 2
    stub, local = sorted(stub_ms)[mid], sorted(local_ms)[mid]
    print(
        f"STUB lines={args.lines} stub_cpu_ms_per_token={stub:.3f} inprocess_cpu_ms_per_token={local:.3f} "
        f"ratio={stub / local:.2f} wall_vs_inprocess={sorted(speed)[mid]:.2f} load1={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
