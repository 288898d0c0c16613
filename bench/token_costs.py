"""What a completion token costs against a prompt token on a generation engine: the measurement behind a
catalogue model's ``completion_weight`` (fair share charges (prompt - cached) + w × completion tokens,
kinds/generation/units.py).

Same engine and configuration as the Triton model (bench/generation.py's ``InProcess``: tinylm's
continuous-batching engine, one thread, its KV budget and max_num_seqs, prefix caching off so every prompt
token is computed), two runs over the same prompts, side by side, each repeated and the median kept:

- prefill: long prompts (~130–190 tokens), ``max_tokens`` 1 → seconds per prompt token;
- prefill + decode: the same prompts asking for long counts, ``max_tokens`` 48 → the extra seconds over the
  first run, per extra completion token.

``completion_weight = decode seconds per token / prefill seconds per token``. Ends with one parseable line:

    TOKEN_COSTS prefill_us_per_token=… decode_us_per_token=… completion_weight=… lines=… load1=…

    .venv/bin/python bench/token_costs.py [--lines 64] [--repeat 3] [--model-dir DIR --threads N]

``--model-dir triton_models/smollm2/1/hf --threads 2`` measures SmolLM2 as triton_models/smollm2 serves it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.generation import FILLER, MODEL_DIR, InProcess, Line

LONG_MAX_TOKENS = 48  # long enough that decode dominates the second run, inside tinylm's 256-token context


def corpus(n: int, seed: int = 11) -> list[list[dict[str, str]]]:
    """Prompts of 120–180 filler words before a question whose answer is a long count."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        system = " ".join(rng.choice(FILLER) for _ in range(rng.randint(120, 180)))
        a = rng.randint(0, 5)
        out.append([{"role": "system", "content": system}, {"role": "user", "content": f"count from {a} to 40"}])
    return out


def timed(local: InProcess, lines: list[Line]) -> tuple[float, int, int]:
    """(seconds, prompt tokens, completion tokens) of one engine run over ``lines``, prefix cache off."""
    from cb_sampling import SamplingParams

    engine = local.uncached
    prompts = local.prompts(lines)
    params = [SamplingParams(max_tokens=line.max_tokens, temperature=0.0) for line in lines]
    started = time.perf_counter()
    requests = engine.generate(prompts, params)
    seconds = time.perf_counter() - started
    prompt_tokens = sum(len(local.tokenizer(p, add_special_tokens=True)["input_ids"]) for p in prompts)
    completion = sum(len(choice.token_ids) for request in requests for choice in request.choices)
    return seconds, prompt_tokens, completion


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=64, help="prompts per run (default 64: max_num_seqs)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind; medians are reported")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR / "hf", help="default: tinylm's")
    parser.add_argument("--threads", type=int, default=1, help="the Triton model's INTRA_OP_THREADS")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    messages = corpus(args.lines)
    short = [Line(m, 1) for m in messages]
    long = [Line(m, LONG_MAX_TOKENS) for m in messages]
    local = InProcess(args.model_dir, threads=args.threads)
    timed(local, short[:8])  # warm-up: the first forward passes allocate
    prefill_us, decode_us, weights = [], [], []
    for _ in range(args.repeat):
        s1, prompt_tokens, c1 = timed(local, short)
        s2, _, c2 = timed(local, long)
        per_prompt = s1 / prompt_tokens  # includes one decode step per line: small beside ~200 prompt tokens
        per_completion = (s2 - s1) / max(1, c2 - c1)
        prefill_us.append(per_prompt * 1e6)
        decode_us.append(per_completion * 1e6)
        weights.append(per_completion / per_prompt)
        print(
            f"  prefill {prompt_tokens} tokens in {s1:.2f} s; +{c2 - c1} completion tokens in {s2 - s1:.2f} s "
            f"more: weight {per_completion / per_prompt:.1f}",
            flush=True,
        )
    pre, dec, w = statistics.median(prefill_us), statistics.median(decode_us), statistics.median(weights)
    print()
    print(f"{'token':<12}{'µs/token':>10}")
    print(f"{'prompt':<12}{pre:>10.1f}")
    print(f"{'completion':<12}{dec:>10.1f}")
    print(f"runs: weights {', '.join(f'{x:.1f}' for x in weights)}")
    print(
        f"TOKEN_COSTS prefill_us_per_token={pre:.1f} decode_us_per_token={dec:.1f} completion_weight={w:.2f} "
        f"lines={args.lines} load1={load:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
