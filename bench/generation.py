"""Generation through the stack, side by side with the same engine in one process.

Three ratios, each measured in this run against a reference measured beside it:

- ``vs_inprocess``: a chat-completions batch end to end (upload → batch → output downloaded, the local stack:
  gunicorn, Celery workers, tritonserver with tinylm) against tinylm's engine (triton_models/tinylm/1/cb_engine.py)
  in this process at the Triton model's configuration (KV budget, max_num_seqs, prefix caching, one thread),
  fed every prompt at once: completion tokens per second of each. The reference is measured right before and
  right after the batch and averaged (this host's speed drifts within minutes).
- ``cb_vs_static``: the continuous-batching engine against Hugging Face static-batch ``generate``
  (cb_baseline.py) at its best batch size, on the mixed corpus (mixed prompt lengths, mixed max_tokens), greedy,
  in process: useful completion tokens per second.
- ``prefix_speedup``: the engine with prefix caching against the engine without, on a corpus whose lines share a
  ~200-token system prompt, in process (the median of three pairs, on and off alternately).

- ``cb_vs_static_longtail``: the same comparison on a corpus with a long tail of output lengths (most answers
  short, one in eight long), an additional row: on the mixed corpus a static batch wastes only about half its
  row-steps (answers 3–24 numbers, max_tokens 8–40), which bounds what refilling can win there.

``direct_vs_inprocess`` splits ``vs_inprocess``: the corpus sent straight to the stack's tritonserver
(bench/generation_direct.py), beside the same references; what is left between it and the batch end to end is the
control plane's (upload, validation, dispatch, commit, finalize, download). ``small_p50_s`` is the median
end-to-end time of a 4-line batch. Ends with one parseable line:

    GENERATION e2e_tokens_per_s=… vs_inprocess=… direct_vs_inprocess=… cb_vs_static=… prefix_speedup=… small_p50_s=… load1=…
    cb_vs_static_longtail=…

    .venv/bin/python bench/generation.py [--lines 128] [--repeat 1]

Small by default (the development host is two shared cores); figures in docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO_ROOT / "triton_models" / "tinylm" / "1"
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(MODEL_DIR))  # the engine's modules sit beside model.py, as Triton's python backend wants

from bench.generation_direct import direct_tokens_per_s  # noqa: E402
from bench.hotpath import Bench, Run  # noqa: E402
from bench.proctrees import thread_cpu_seconds  # noqa: E402

MODEL = "tinylm"
CHAT = "/v1/chat/completions"
FILLER = ["you", "are", "a", "helpful", "assistant", "please", "answer", "the", "question", "carefully", "."]
# The Triton model's engine settings (triton_models/tinylm/config.pbtxt), so the in-process reference is the
# same engine at the same configuration.
KV_BUDGET_TOKENS = 16384
MAX_NUM_SEQS = 64
STATIC_BATCH_SIZES = (8, 16, 32, 64)
PREFIX_PAIRS = 3


@dataclass(frozen=True)
class Line:
    messages: list[dict[str, str]]
    max_tokens: int


def mixed_corpus(n: int, seed: int = 2026) -> list[Line]:
    """Mixed prompt lengths (no system prompt, or 10–150 filler words) and mixed max_tokens (8–40): answers end
    at EOS (a count of 3–24 numbers) or at max_tokens, so sequences finish at very different steps."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        a = rng.randint(0, 16)
        b = a + rng.randint(2, 23)
        messages = [{"role": "user", "content": f"count from {a} to {min(b, 40)}"}]
        if rng.random() < 0.6:
            words = " ".join(rng.choice(FILLER) for _ in range(rng.randint(10, 150)))
            messages.insert(0, {"role": "system", "content": words})
        lines.append(Line(messages, rng.choice((8, 16, 24, 32, 40))))
    return lines


def long_tail_corpus(n: int, seed: int = 11) -> list[Line]:
    """A realistic spread of output lengths, which the mixed corpus lacks: most answers are short (3–6 numbers,
    max_tokens 16) and one line in eight is long (31–41 numbers, max_tokens 64; tinylm counts up to 40). A
    static batch of 16 then almost always holds a long line and runs ~40 steps for ~10 useful tokens a row;
    continuous batching refills the short lines' places. An extra row beside the mixed corpus, not instead."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        if rng.random() < 0.125:
            a = rng.randint(0, 9)
            lines.append(Line([{"role": "user", "content": f"count from {a} to {a + rng.randint(30, 40 - a)}"}], 64))
        else:
            a = rng.randint(0, 30)
            lines.append(Line([{"role": "user", "content": f"count from {a} to {a + rng.randint(2, 5)}"}], 16))
    return lines


def shared_prefix_corpus(n: int, seed: int = 7) -> list[Line]:
    """Every line shares one ~200-token system prompt; the questions differ."""
    rng = random.Random(seed)
    system = {"role": "system", "content": " ".join(rng.choice(FILLER) for _ in range(200))}
    lines = []
    for _ in range(n):
        a = rng.randint(0, 30)
        lines.append(Line([system, {"role": "user", "content": f"count from {a} to {a + rng.randint(2, 9)}"}], 16))
    return lines


def jsonl(lines: list[Line], model: str = MODEL) -> bytes:
    return (
        "\n".join(
            json.dumps(
                {
                    "custom_id": f"g-{i}",
                    "method": "POST",
                    "url": CHAT,
                    "body": {
                        "model": model,
                        "messages": line.messages,
                        "max_tokens": line.max_tokens,
                        "temperature": 0,
                    },
                }
            )
            for i, line in enumerate(lines)
        )
        + "\n"
    ).encode()


# -- in process ----------------------------------------------------------------------------------------


class InProcess:
    """tinylm's engine and tokenizer in this process, prompts rendered with the model's chat template as the
    service renders them (kinds/generation/bodies.py)."""

    def __init__(self, hf: Path = MODEL_DIR / "hf", *, threads: int = 1) -> None:
        import torch

        torch.set_num_threads(threads)  # the Triton model's INTRA_OP_THREADS
        from cb_engine import Engine

        self.hf = str(hf)
        self.cached = Engine(self.hf, kv_budget_tokens=KV_BUDGET_TOKENS, max_seqs=MAX_NUM_SEQS, threads=threads)
        self.uncached = Engine(
            self.hf, kv_budget_tokens=KV_BUDGET_TOKENS, max_seqs=MAX_NUM_SEQS, threads=threads, prefix_caching=False
        )
        self.tokenizer = self.cached.tokenizer

    def prompts(self, lines: list[Line]) -> list[str]:
        return [
            self.tokenizer.apply_chat_template(line.messages, add_generation_prompt=True, tokenize=False)
            for line in lines
        ]

    def engine_tokens_per_s(self, lines: list[Line], *, prefix_caching: bool = True) -> tuple[float, int]:
        from cb_sampling import SamplingParams

        engine = self.cached if prefix_caching else self.uncached
        if engine.prefix_cache is not None:
            # Each measurement starts cold, as a new batch on the server does (the mixed corpus repeats).
            engine.prefix_cache.evict(engine.prefix_cache.held_tokens)
        prompts = self.prompts(lines)
        params = [SamplingParams(max_tokens=line.max_tokens, temperature=0.0) for line in lines]
        started = time.perf_counter()
        requests = engine.generate(prompts, params)
        seconds = time.perf_counter() - started
        tokens = sum(len(choice.token_ids) for request in requests for choice in request.choices)
        return tokens / seconds, tokens

    def static_tokens_per_s(self, lines: list[Line], batch_size: int) -> float:
        from cb_baseline import static_generate

        prompts = self.prompts(lines)
        started = time.perf_counter()
        results = static_generate(
            self.cached.model, self.tokenizer, prompts, [line.max_tokens for line in lines], batch_size=batch_size
        )
        return sum(len(ids) for ids in results) / (time.perf_counter() - started)


# -- through the stack ---------------------------------------------------------------------------------


def run_batch(bench: Bench, content: bytes, lines: int) -> tuple[Run, int]:
    """(the run, completion tokens) of one chat batch: the tokens from the Batch object's usage."""
    run = bench.run(content, lines, endpoint=CHAT)
    usage = bench.conn.execute(
        "SELECT completion_tokens FROM batches_batch ORDER BY created_at DESC LIMIT 1"  # the one just run
    ).fetchone()
    return run, int(usage[0])


def _through_the_stack(
    local: InProcess,
    mixed: list[Line],
    repeat: int,
    small_runs: int,
    e2e: list[tuple[float, float, float, float]],
    small: list[float],
    profile: bool = False,
) -> None:
    bench = Bench(REPO_ROOT / "var" / "bench-generation", warm_models=(MODEL,))
    try:
        bench.start()
        bench.stack.manage("catalogue_warm", MODEL, "--min-instances", "1", "--actor", "bench")
        bench.stack.wait_warm()
        content = jsonl(mixed)
        bench.run(jsonl(mixed[:8]), 8, endpoint=CHAT)  # warm-up: the model's first shard, its measured speed
        if profile:
            profile_batch(bench, content, len(mixed), MODEL, REPO_ROOT / "var" / "bench-generation")
        prompts = local.prompts(mixed)
        ids = [local.tokenizer(prompt, add_special_tokens=True)["input_ids"] for prompt in prompts]
        limits = [line.max_tokens for line in mixed]
        url = bench.stack.triton_grpc_url
        for _ in range(repeat):
            before, _ = local.engine_tokens_per_s(mixed)
            direct, _ = direct_tokens_per_s(url, MODEL, prompts, ids, limits, inflight=2 * MAX_NUM_SEQS)
            run, tokens = run_batch(bench, content, len(mixed))
            after, _ = local.engine_tokens_per_s(mixed)
            reference = (before + after) / 2
            seconds = run.e2e_s
            e2e.append((tokens / seconds, reference, tokens / seconds / reference, direct))
            cpu = ", ".join(f"{name} {cpu_s:.1f}" for name, cpu_s in sorted(run.cpu.items()))
            print(
                f"  e2e {tokens} tokens in {seconds:.1f} s: {tokens / seconds:,.0f} tokens/s (in process "
                f"{reference:,.0f}; direct to tritonserver {direct:,.0f}; upload {run.upload_s:.1f} s, validating {run.validating_s:.1f} s, in progress "
                f"{run.in_progress_s:.1f} s, finalizing {run.finalizing_s:.1f} s, download {run.download_s:.1f} s; "
                f"CPU s: {cpu}; load {os.getloadavg()[0]:.1f}){refused_connections(bench)}",
                flush=True,
            )
        for _ in range(small_runs):
            small.append(bench.run(jsonl(mixed[:4]), 4, endpoint=CHAT).e2e_s)
    finally:
        bench.stop()


def refused_connections(bench: Bench) -> str:
    """A warning when Postgres refused the stack connections so far (max_connections, reached when several
    stacks and suites share the host): validation and shards then retry, and the run times that, not the code."""
    refused = sum(
        path.read_text(errors="replace").count("too many clients") for path in bench.stack.log_dir.glob("*.log")
    )
    return f"; POSTGRES REFUSED {refused} CONNECTIONS SO FAR (host limit): not a fair run" if refused else ""


def profile_batch(bench: Bench, content: bytes, lines: int, model: str, out: Path) -> None:
    """py-spy over the shard worker, the validation worker and the model's python-backend stub (the engine) during
    one batch of the corpus (not timed), and the CPU seconds of tritonserver's threads; profiles under ``out``."""
    triton = bench.stack.procs["triton"].pid
    stub = [pid for pid in _descendants(triton) if f"/{model}/" in _cmdline(pid) and "stub" in _cmdline(pid)]
    trees = ["worker", "validation", *(["engine"] if stub else [])]
    threads_before = thread_cpu_seconds(triton)
    summaries = bench.profile_trees(
        content,
        lines,
        {tree: out / f"profile-{tree}.txt" for tree in trees},
        endpoint=CHAT,
        pids={"engine": stub[0]} if stub else None,
    )
    threads = {name: s - threads_before.get(name, 0.0) for name, s in thread_cpu_seconds(triton).items()}
    for tree, summary in summaries.items():
        print(f"-- profile of the {tree} tree ({out / f'profile-{tree}.txt'})\n{summary}\n", flush=True)
    if bench.last_run is not None:
        cpu = ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(bench.last_run.cpu.items()))
        print(f"CPU seconds during the profiled batch: {cpu}", flush=True)
    busiest = sorted(threads.items(), key=lambda kv: -kv[1])[:12]
    print("tritonserver's threads (CPU s): " + ", ".join(f"{name} {s:.2f}" for name, s in busiest), flush=True)


def _descendants(pid: int) -> list[int]:
    found, stack = [], [pid]
    while stack:
        for task in Path(f"/proc/{stack.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            stack += children
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=128, help="lines of the mixed corpus (default 128)")
    parser.add_argument("--repeat", type=int, default=1, help="end-to-end runs; the median ratio is reported")
    parser.add_argument("--small-runs", type=int, default=3, help="4-line batches timed for small_p50_s")
    parser.add_argument(
        "--profile", action="store_true", help="first, py-spy the shard and validation workers over one batch"
    )
    parser.add_argument(
        "--e2e-only", action="store_true", help="vs_inprocess and small_p50_s only (no static sweep, no prefix runs)"
    )
    parser.add_argument("--inprocess-only", action="store_true", help="cb_vs_static and prefix_speedup only")
    args = parser.parse_args()
    load = os.getloadavg()
    print(f"generation on {MODEL}: {args.lines} mixed lines; cores {os.cpu_count()}; load {load[0]:.1f}", flush=True)
    mixed = mixed_corpus(args.lines)
    shared = shared_prefix_corpus(args.lines)
    tail = long_tail_corpus(args.lines)
    local = InProcess()
    local.engine_tokens_per_s(mixed[:16])  # warm-up (first forward passes allocate)

    # In process: continuous batching vs static batching at its best batch size; prefix caching on vs off.
    # The engine right before and right after the static sweep, averaged (as the end-to-end reference is): one
    # engine run seconds away from the sweep moved the ratio by 2x at load 10-15.
    # --e2e-only skips them (their ratios print as 0): minutes of a 1024-line run that the stack's figure
    # does not need, when before/after runs of the stack alternate.
    cb = cb_tail = cached = 0.0
    static = static_tail = dict.fromkeys(STATIC_BATCH_SIZES, 1.0)
    uncached = 1.0
    if not args.e2e_only:
        cb_before, _ = local.engine_tokens_per_s(mixed)
        static = {size: local.static_tokens_per_s(mixed, size) for size in STATIC_BATCH_SIZES}
        cb = (cb_before + local.engine_tokens_per_s(mixed)[0]) / 2
        tail_before, _ = local.engine_tokens_per_s(tail)
        static_tail = {size: local.static_tokens_per_s(tail, size) for size in STATIC_BATCH_SIZES}
        cb_tail = (tail_before + local.engine_tokens_per_s(tail)[0]) / 2
        # On and off alternately, three pairs, the median pair by ratio: one pair's ratio moved from 1.14 to 1.57
        # between two runs a minute apart on a quiet host (a run is ~0.3 s).
        pairs = sorted(
            (
                (
                    local.engine_tokens_per_s(shared, prefix_caching=True)[0],
                    local.engine_tokens_per_s(shared, prefix_caching=False)[0],
                )
                for _ in range(PREFIX_PAIRS)
            ),
            key=lambda pair: pair[0] / pair[1],
        )
        cached, uncached = pairs[len(pairs) // 2]
        print("prefix cache on/off pairs: " + ", ".join(f"{on:,.0f}/{off:,.0f}" for on, off in pairs), flush=True)
    best_size = max(static, key=lambda size: static[size])
    best_tail = max(static_tail, key=lambda size: static_tail[size])

    # Through the stack (unless --inprocess-only: then no end-to-end figure, vs_inprocess 0).
    # (tokens/s, reference tokens/s, ratio, the served engine straight through tritonserver in tokens/s)
    e2e: list[tuple[float, float, float, float]] = []
    small: list[float] = []
    if args.inprocess_only:
        e2e.append((0.0, local.engine_tokens_per_s(mixed)[0], 0.0, 0.0))
    else:
        _through_the_stack(local, mixed, args.repeat, args.small_runs, e2e, small, args.profile)
    e2e.sort(key=lambda row: row[2])
    e2e_rate, reference, vs_inprocess, direct = e2e[len(e2e) // 2]

    print()
    rows: list[tuple[str, float, float, str]] = [
        ("e2e vs in-process engine", e2e_rate, reference, "completion tokens/s, mixed corpus"),
        ("  direct to tritonserver", direct, reference, "the served engine, no control plane (one stream)"),
        ("  e2e vs direct", e2e_rate, direct or 1.0, "the control plane's share of the gap"),
        ("continuous vs static", cb, static[best_size], f"static at its best batch size, {best_size}"),
        ("  long-tail corpus", cb_tail, static_tail[best_tail], f"static at its best batch size, {best_tail}"),
        ("prefix cache on vs off", cached, uncached, "shared ~200-token system prompt"),
    ]
    print(f"{'comparison':<28}{'tokens/s':>10}{'reference':>11}{'ratio':>8}  note")
    for name, value, ref, note in rows:
        print(f"{name:<28}{value:>10,.0f}{ref:>11,.0f}{value / ref:>8.2f}  {note}")
    print("static batch sizes: " + ", ".join(f"{size}: {rate:,.0f}" for size, rate in static.items()))
    print("  long tail: " + ", ".join(f"{size}: {rate:,.0f}" for size, rate in static_tail.items()))
    small_p50 = statistics.median(small) if small else 0.0
    print(
        f"GENERATION lines={len(mixed)} e2e_tokens_per_s={e2e_rate:.0f} inprocess_tokens_per_s={reference:.0f} "
        f"vs_inprocess={vs_inprocess:.3f} direct_vs_inprocess={direct / reference:.3f} cb_vs_static={cb / static[best_size]:.3f} "
        f"prefix_speedup={cached / uncached:.3f} small_p50_s={small_p50:.2f} load1={load[0]:.1f} "
        f"cb_vs_static_longtail={cb_tail / static_tail[best_tail]:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
