"""A real instruct LLM (SmolLM2-135M-Instruct) through the product, side by side with what else could serve it.

One corpus, one run, the same weights everywhere: 256 chat lines (bench/real_corpus.py: varied prompt lengths,
half opening with one of three ~220–300-token system prompts), rendered once with the model's chat template and
tokenized once; every contender gets those token ids, decodes greedily, and stops at EOS or at max_tokens
(default 32). The product cannot be told to ignore EOS (the service does not take vLLM's ``ignore_eos``), so
no contender does: each figure is the completion tokens it actually generated (EOS counted, as ``usage``
counts it) per second of wall time, and the table prints each one's token total and how many of its lines
match the engine's tokens exactly (greedy on the same weights; float32 HF and llama.cpp's Q4_1 kernels round
differently, so a few answers drift apart).

- (a) the product end to end: upload → batch on ``/v1/chat/completions`` (model ``smollm2-135m-instruct``) →
  output downloaded, through the local stack (gunicorn, Celery workers, tritonserver with triton_models/smollm2)
  as bench/generation.py runs it: ``usage.completion_tokens`` of the batch over the whole wall time.
- (b) the project's engine (triton_models/tinylm/1/cb_engine.py, which serves smollm2) in this process, every
  line submitted at once, at its best configuration: max_seqs × threads swept around the Triton model's own
  (config.pbtxt's KV budget, block size, prefix caching, served context). ``vs_inprocess`` = (a) ÷ the best,
  which is re-run right before and right after (a) and averaged (this host's speed drifts within minutes):
  the ceiling of what the stack can reach with this engine, the same work with no control plane at all.
- (c) Hugging Face ``generate`` with static batches, left padding, at its best batch size, lines in corpus
  order as a naive user would send them (and sorted by length at that size, the cheapest improvement).
- (d) Hugging Face's own continuous batching, ``generate_batch``, with a bounded paged cache (its defaults size
  the cache from host memory), over a couple of cache / max_batch_tokens settings.
- (e) llama.cpp on the original GGUF (Q4_1, the weights the HF directory was dequantized from) through
  llama-cpp-python's low-level batched API, parallel slots as llama.cpp's server runs them (bench/llamacpp_worker.py),
  in its own virtual environment under var/bench-llamacpp (built on first use, never by ``make install``).
- (f) ``prefix_speedup``: the engine at its best configuration on the shared-system-prompt half only, prefix
  caching on ÷ off.

Every ``vs_*`` ratio is the product end to end over that contender: above 1, the product with its control
plane outruns it on this corpus. ``ttft_p50_s`` is measured in process, not through the stack (a batch's output
has no per-line timing): the median, over the lines of the engine's best sweep run, of the time from submitting
the whole corpus at once to the line's first generated token (recorded after each engine step, when its first
token id appears). Ends with one parseable line:

    REAL_GENERATION e2e_tokens_per_s=… vs_inprocess=… vs_hf_static=… vs_hf_cb=… vs_llamacpp=… prefix_speedup=…
    ttft_p50_s=… lines=… max_tokens=… load1=… inprocess_tokens_per_s=… inprocess_sweep_best_tokens_per_s=…

    .venv/bin/python bench/real_generation.py [--lines 256] [--max-tokens 32] [--quick] [--no-llamacpp]
    .venv/bin/python bench/real_generation.py --lines 128 --profile-e2e   # where the gap to (b) goes

The corpus is prefill-heavy (~53k prompt tokens for ~8k completion tokens at 256 lines), so on the two-core
development host the full sweeps take the better part of an hour; ``--lines 32 --quick`` takes ~7 minutes, plus
~8 the first time llama-cpp-python is built.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

# bench.generation puts the engine's folder on sys.path (tinylm's engine serves smollm2 too).
from bench.generation import CHAT, Line, jsonl, profile_batch, refused_connections, run_batch  # noqa: E402
from bench.hotpath import Bench  # noqa: E402
from bench.llamacpp_worker import llamacpp_runs  # noqa: E402
from bench.real_corpus import real_corpus  # noqa: E402

MODEL = "smollm2-135m-instruct"
TRITON_MODEL = REPO_ROOT / "triton_models" / "smollm2"
HF_DIR = TRITON_MODEL / "1" / "hf"
# Two threads only: with both cores free in process, one thread left one idle (the served model's INTRA_OP_THREADS
# is 2 as well).
ENGINE_SWEEP = {"max_seqs": (32, 64), "threads": (2,)}
ENGINE_SWEEP_QUICK = {"max_seqs": (32, 64), "threads": (2,)}
STATIC_BATCH_SIZES = (16, 32, 64)
STATIC_BATCH_SIZES_QUICK = (16, 32)
# (cache blocks of 16 tokens, max_batch_tokens): transformers' paged attention on CPU masks the whole cache for
# every query, so a smaller cache is faster while the lines in flight fit it. The engine's own budget (1,024
# blocks) was several times slower again here (12 lines: 58 s against 4.5 s at 256 blocks), so it is left out.
HF_CB_CONFIGS = ((256, 256), (512, 512))
HF_CB_CONFIGS_QUICK = ((256, 256),)
# 32 slots ran at under half of 8's tokens/s in a quick 64-line run here; the sweep stays around the best.
LLAMACPP_SLOTS = (4, 8, 16)
LLAMACPP_SLOTS_QUICK = (8, 32)


@dataclass
class Measured:
    config: str
    params: tuple[int, ...]  # the swept settings, in the order the config names them
    tokens: int
    seconds: float
    outputs: list[list[int]] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def engine_settings() -> dict[str, str]:
    """The Triton model's parameters (config.pbtxt), so the in-process engine is the served one, configured alike."""
    text = (TRITON_MODEL / "config.pbtxt").read_text()
    return dict(re.findall(r'key: "(\w+)"\s*value: \{ string_value: "([^"]*)" \}', text))


# -- (b) and (f): the project's engine in process --------------------------------------------------------


def engine_run(
    prompts: list[list[int]], max_tokens: int, *, max_seqs: int, threads: int, prefix_caching: bool = True
) -> Measured:
    """Every line submitted at once to a fresh engine (a cold prefix cache, as a new batch meets on the
    server), stepped to the end in this thread; each line's first token time is read after each step."""
    from cb_engine import Engine
    from cb_sampling import SamplingParams

    settings = engine_settings()
    engine = Engine(
        str(HF_DIR),
        kv_budget_tokens=int(settings["KV_BUDGET_TOKENS"]),
        max_seqs=max_seqs,
        block_size=int(settings["BLOCK_SIZE"]),
        prefix_caching=prefix_caching,
        threads=threads,
        max_model_len=int(settings["MAX_MODEL_LEN"]),
    )
    engine.generate(prompts[:4], SamplingParams(max_tokens=4, temperature=0.0))  # first passes allocate
    if engine.prefix_cache is not None:
        engine.prefix_cache.evict(engine.prefix_cache.held_tokens)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    finished: list[int] = []
    started = time.perf_counter()
    requests = [
        engine.submit(ids, params, request_id=f"r{i}", on_update=lambda r: r.finished and finished.append(1))
        for i, ids in enumerate(prompts)
    ]
    first: dict[int, float] = {}
    waiting = list(range(len(requests)))
    while len(finished) < len(requests):
        engine.step()
        now = time.perf_counter() - started
        for i in waiting:
            if requests[i].choices[0].token_ids:
                first[i] = now
        waiting = [i for i in waiting if i not in first]
    seconds = time.perf_counter() - started
    outputs = [list(request.choices[0].token_ids) for request in requests]
    del engine
    gc.collect()
    config = f"max_seqs {max_seqs}, threads {threads}" + ("" if prefix_caching else ", prefix caching off")
    return Measured(config, (max_seqs, threads), sum(map(len, outputs)), seconds, outputs, sorted(first.values()))


# -- (c) and (d): transformers -----------------------------------------------------------------------------


def hf_static(model, tokenizer, texts: list[str], max_tokens: int, batch_size: int, *, by_length: bool) -> Measured:
    """Static batches of ``generate`` (cb_baseline.py: left padding, greedy, each batch runs until all its rows
    ended), tokens cut at each line's own EOS."""
    from cb_baseline import static_generate

    order = sorted(range(len(texts)), key=lambda i: len(texts[i])) if by_length else list(range(len(texts)))
    started = time.perf_counter()
    results = static_generate(
        model, tokenizer, [texts[i] for i in order], [max_tokens] * len(texts), batch_size=batch_size
    )
    seconds = time.perf_counter() - started
    outputs: list[list[int]] = [[] for _ in texts]
    for i, ids in zip(order, results, strict=True):
        outputs[i] = ids
    config = f"batch {batch_size}, " + ("sorted by length" if by_length else "corpus order")
    return Measured(config, (batch_size,), sum(map(len, outputs)), seconds, outputs)


def hf_continuous(model, prompts: list[list[int]], max_tokens: int, num_blocks: int, batch_tokens: int) -> Measured:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=2, pad_token_id=2)
    cache = ContinuousBatchingConfig(
        page_size=16, num_blocks=num_blocks, max_batch_tokens=batch_tokens, max_requests_per_batch=64
    )
    run = {"generation_config": generation, "continuous_batching_config": cache, "warmup": False}
    model.generate_batch(inputs=prompts[:4], **run)  # first passes allocate
    started = time.perf_counter()
    results = model.generate_batch(inputs=prompts, **run)
    seconds = time.perf_counter() - started
    outputs = [list(result.generated_tokens) for result in results.values()]
    if len(outputs) != len(prompts) or any(result.error for result in results.values()):
        raise RuntimeError(f"generate_batch answered {len(outputs)} of {len(prompts)} lines")
    config = f"{num_blocks} blocks of 16, max_batch_tokens {batch_tokens}"
    return Measured(config, (num_blocks, batch_tokens), sum(map(len, outputs)), seconds, outputs)


# -- (a): the product end to end ---------------------------------------------------------------------------


def product_e2e(lines: list[Line], reference, *, profile: bool = False) -> tuple[Measured, list[Measured]]:
    """One batch of the corpus through the local stack, the in-process reference right before and after it;
    with ``profile``, first one more batch of it under py-spy (not timed: where the stack's CPU goes)."""
    out = REPO_ROOT / "var" / "bench-real-generation"
    bench = Bench(out, warm_models=(MODEL,))
    around: list[Measured] = []
    try:
        bench.start()
        bench.stack.manage("catalogue_warm", MODEL, "--min-instances", "1", "--actor", "bench")
        bench.stack.wait_warm()
        bench.run(jsonl(lines[:8], MODEL), 8, endpoint=CHAT)  # warm-up: the model's first shard
        if profile:
            profile_batch(bench, jsonl(lines, MODEL), len(lines), TRITON_MODEL.name, out)
        around.append(reference())
        run, tokens = run_batch(bench, jsonl(lines, MODEL), len(lines))
        around.append(reference())
        print(
            f"  e2e {tokens} tokens in {run.e2e_s:.1f} s: {tokens / run.e2e_s:,.1f} tokens/s (upload {run.upload_s:.1f} s, "
            f"validating {run.validating_s:.1f} s, in progress {run.in_progress_s:.1f} s, finalizing "
            f"{run.finalizing_s:.1f} s, download {run.download_s:.1f} s; load {os.getloadavg()[0]:.1f})"
            f"{refused_connections(bench)}",
            flush=True,
        )
    finally:
        bench.stop()
    return Measured(f"one batch of {len(lines)} lines, {CHAT}", (), tokens, run.e2e_s), around


# -- the run -------------------------------------------------------------------------------------------------


def profile_gap(lines: list[Line], prompts: list[list[int]], max_tokens: int) -> int:
    """(a) with a profiled batch first, against the served configuration in process (its CPU seconds too)."""
    settings = engine_settings()
    seqs, threads = int(settings["MAX_NUM_SEQS"]), int(settings["INTRA_OP_THREADS"])
    cpu: list[float] = []

    def reference() -> Measured:
        before = time.process_time()
        measured = engine_run(prompts, max_tokens, max_seqs=seqs, threads=threads)
        cpu.append(time.process_time() - before)
        return measured

    product, around = product_e2e(lines, reference, profile=True)
    inprocess = statistics.mean(m.rate for m in around)
    print(
        f"in process (max_seqs {seqs}, threads {threads}): {', '.join(f'{m.rate:,.1f}' for m in around)} tokens/s, "
        f"{statistics.mean(m.seconds for m in around):.1f} s wall, {statistics.mean(cpu):.1f} CPU s a run"
    )
    print(f"REAL_GENERATION_GAP e2e_tokens_per_s={product.rate:.1f} vs_inprocess={product.rate / inprocess:.3f}")
    return 0


def _best(runs: list[Measured]) -> Measured:
    return max(runs, key=lambda m: m.rate)


def _sweep(title: str, runs: list[Measured]) -> None:
    print(f"{title}: " + "; ".join(f"{m.config}: {m.rate:,.1f}" for m in runs), flush=True)


def _same(outputs: list[list[int]], reference: list[list[int]]) -> str:
    if not outputs:
        return "–"
    if outputs is reference:
        return "ref"
    return f"{sum(a == b for a, b in zip(outputs, reference, strict=True))}/{len(reference)}"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=256, help="lines of the corpus (default 256)")
    parser.add_argument("--max-tokens", type=int, default=32, help="max_tokens of every line (default 32)")
    parser.add_argument("--quick", action="store_true", help="smaller sweeps (one or two settings a contender)")
    parser.add_argument("--no-llamacpp", action="store_true", help="leave out llama.cpp (vs_llamacpp prints 0)")
    parser.add_argument(
        "--profile-e2e",
        action="store_true",
        help="only (a) beside the served engine configuration in process, with one more batch under py-spy first "
        "(the stub, the shard and control workers, tritonserver's threads): where the gap to in process goes",
    )
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load = os.getloadavg()
    print(f"{MODEL}: {args.lines} lines, max_tokens {args.max_tokens}; cores {os.cpu_count()}; load {load[0]:.1f}")
    lines, shared = real_corpus(args.lines, args.max_tokens)
    tokenizer = AutoTokenizer.from_pretrained(HF_DIR)
    texts = [tokenizer.apply_chat_template(line.messages, add_generation_prompt=True, tokenize=False) for line in lines]
    # No BOS of the tokenizer's own (SmolLM2's template writes <|im_start|> itself): the ids the service prefills.
    prompts = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    lengths = sorted(map(len, prompts))
    print(f"prompt tokens: min {lengths[0]}, median {lengths[len(lengths) // 2]}, max {lengths[-1]}; "
          f"{len(shared)} lines open with a shared system prompt", flush=True)  # fmt: skip

    if args.profile_e2e:
        return profile_gap(lines, prompts, args.max_tokens)

    # (b) the engine in process: the sweep, then the best configuration for (f).
    sweep = ENGINE_SWEEP_QUICK if args.quick else ENGINE_SWEEP
    engine_runs = [
        engine_run(prompts, args.max_tokens, max_seqs=seqs, threads=threads)
        for seqs in sweep["max_seqs"]
        for threads in sweep["threads"]
    ]
    _sweep("engine in process (max_seqs, threads), tokens/s", engine_runs)
    best_engine = _best(engine_runs)
    best_seqs, best_threads = best_engine.params
    shared_prompts = [prompts[i] for i in shared]
    cached = engine_run(shared_prompts, args.max_tokens, max_seqs=best_seqs, threads=best_threads)
    uncached = engine_run(
        shared_prompts, args.max_tokens, max_seqs=best_seqs, threads=best_threads, prefix_caching=False
    )
    print(f"prefix caching on the shared half: on {cached.rate:,.1f}, off {uncached.rate:,.1f} tokens/s", flush=True)

    # (c) and (d): transformers, both cores.
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(HF_DIR, dtype=torch.float32).eval()
    sizes = STATIC_BATCH_SIZES_QUICK if args.quick else STATIC_BATCH_SIZES
    static_runs = [hf_static(model, tokenizer, texts, args.max_tokens, size, by_length=False) for size in sizes]
    best_size = _best(static_runs).params[0]
    static_runs.append(hf_static(model, tokenizer, texts, args.max_tokens, best_size, by_length=True))
    _sweep("HF generate, static batches, tokens/s", static_runs)
    cb_configs = HF_CB_CONFIGS_QUICK if args.quick else HF_CB_CONFIGS
    cb_runs = [hf_continuous(model, prompts, args.max_tokens, blocks, tokens) for blocks, tokens in cb_configs]
    _sweep("HF generate_batch, tokens/s", cb_runs)
    del model
    gc.collect()

    # (e) llama.cpp on the GGUF, in its own environment.
    llama_runs: list[Measured] = []
    if not args.no_llamacpp:
        slots = LLAMACPP_SLOTS_QUICK if args.quick else LLAMACPP_SLOTS
        for row in llamacpp_runs(prompts, args.max_tokens, [(n, 2) for n in slots]):
            params = (row["slots"], row["threads"])
            llama_runs.append(Measured(row["config"], params, row["tokens"], row["seconds"], row["outputs"]))
        if llama_runs:
            _sweep("llama.cpp (slots, threads), tokens/s", llama_runs)

    # (a) the product, with the best engine configuration right before and right after it.
    product, around = product_e2e(
        lines, lambda: engine_run(prompts, args.max_tokens, max_seqs=best_seqs, threads=best_threads)
    )
    inprocess = Measured(
        f"{best_engine.config} (mean of before and after (a))",
        best_engine.params,
        sum(m.tokens for m in around) // len(around),
        statistics.mean(m.seconds for m in around),
        best_engine.outputs,
    )

    rows = [
        ("(a) product end to end", product),
        ("(b) engine in process", inprocess),
        ("(c) HF generate, static", _best(static_runs)),
        ("(d) HF generate_batch", _best(cb_runs)),
        ("(e) llama.cpp, GGUF Q4_1", _best(llama_runs) if llama_runs else None),
        ("(f) engine, prefix cache on", cached),
        ("    engine, prefix cache off", uncached),
    ]
    reference = best_engine.outputs
    print()
    print(f"{'contender':<30}{'configuration':<58}{'tokens':>8}{'seconds':>9}{'tokens/s':>10}{'same':>9}{'(a) ÷':>7}")
    for name, m in rows:
        if m is None:
            print(f"{name:<30}{'not measured (--no-llamacpp, or the build failed)':<58}")
            continue
        same = _same(m.outputs, [reference[i] for i in shared] if name.startswith(("(f)", "   ")) else reference)
        ratio = f"{product.rate / m.rate:>7.2f}" if not name.startswith(("(f)", "   ")) else ""
        print(f"{name:<30}{m.config:<58}{m.tokens:>8,}{m.seconds:>9.1f}{m.rate:>10,.1f}{same:>9}{ratio}")
    print(
        "tokens: completion tokens generated, EOS included, each line ending at EOS or max_tokens (no contender "
        "ignores EOS: the service cannot be asked to); same: lines whose tokens equal the engine's best sweep run"
    )

    def vs(m: Measured | None) -> float:
        return product.rate / m.rate if m is not None and m.rate else 0.0

    ttft = statistics.median(best_engine.ttfts) if best_engine.ttfts else 0.0
    print(
        f"REAL_GENERATION e2e_tokens_per_s={product.rate:.1f} vs_inprocess={vs(inprocess):.3f} "
        f"vs_hf_static={vs(rows[2][1]):.3f} vs_hf_cb={vs(rows[3][1]):.3f} vs_llamacpp={vs(rows[4][1]):.3f} "
        f"prefix_speedup={cached.rate / uncached.rate:.3f} ttft_p50_s={ttft:.2f} lines={len(lines)} "
        f"max_tokens={args.max_tokens} load1={load[0]:.1f} inprocess_tokens_per_s={inprocess.rate:.1f} "
        f"inprocess_sweep_best_tokens_per_s={best_engine.rate:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
