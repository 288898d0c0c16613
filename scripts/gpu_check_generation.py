"""The `generation` step of scripts/gpu_check.py: tinylm (triton_models/tinylm: the python-backend model with
its own continuous-batching engine, trained by `make install`) on the GPU, tokens/s served by Triton against
the same engine in one process on the same device.

The same workload both ways: N prompts "count from a to b :", greedy, a fixed number of new tokens each
(`ignore_eos`, so both sides generate exactly N x MAX_TOKENS tokens). Served: CLIENTS concurrent HTTP
`generate_stream` calls (the decoupled model answers through its response sender; the HTTP generate
extension carries it without tritonclient, which a packed GPU machine may lack). In process: the engine's
own `generate` over all N prompts at once, its best case (nothing to wait for between requests).
"""

from __future__ import annotations

import copy
import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gpu_check_env import Skip
from gpu_check_http import gpu_groups, groups_text, load

MAX_TOKENS = 32
CLIENTS = 64  # the control plane keeps 2 x MAX_NUM_SEQS in flight per instance; 64 = tinylm's MAX_NUM_SEQS


def tinylm_missing(model_dir: Path) -> str | None:
    """Why the step cannot run, or None: the model is another part of the project and may not be built."""
    if not (model_dir / "config.pbtxt").is_file():
        return f"tinylm not built: no {model_dir}/config.pbtxt"
    if not (model_dir / "1" / "hf" / "config.json").is_file():
        return f"tinylm not built: no {model_dir}/1/hf (make install trains it)"
    return None


def prompts(count: int) -> list[str]:
    # Spans tinylm was trained on (b - a <= 24), so the prompts are in distribution; ignore_eos fixes the length.
    return [f"count from {i % 16} to {i % 16 + 8 + i % 17} :" for i in range(count)]


def sampling() -> dict[str, Any]:
    return {"max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}


def _generate_stream(base: str, prompt: str) -> int:
    body = {
        "text_input": prompt,
        "sampling_parameters": json.dumps(sampling()),
        "exclude_input_in_output": True,
        "return_num_output_tokens": True,
    }
    request = urllib.request.Request(
        f"{base}/v2/models/tinylm/generate_stream", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    last: dict[str, Any] = {}
    with urllib.request.urlopen(request, timeout=300) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data:"):
                last = json.loads(line[5:])
    if "error" in last:
        raise RuntimeError(f"tinylm answered an error: {last['error']}")
    counts = last.get("num_output_tokens")
    return int(sum(counts) if isinstance(counts, list) else counts or 0)


def served_tokens_per_s(base: str, texts: list[str]) -> tuple[float, int]:
    started = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        tokens = sum(pool.map(lambda prompt: _generate_stream(base, prompt), texts))
    return tokens / (time.perf_counter() - started), tokens


def inprocess_tokens_per_s(model_dir: Path, config: dict[str, Any], device: str, texts: list[str]) -> tuple[float, int]:
    """The engine the python model wraps (1/cb_engine.py), with the config's KV budget and sequence cap."""
    sys.path.insert(0, str(model_dir / "1"))
    from cb_engine import Engine
    from cb_sampling import SamplingParams

    parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
    engine = Engine(
        str(model_dir / "1" / "hf"),
        kv_budget_tokens=int(parameters.get("KV_BUDGET_TOKENS", "16384")),
        max_seqs=int(parameters.get("MAX_NUM_SEQS", "64")),
        device=device,
        threads=None if device.startswith("cuda") else int(parameters.get("INTRA_OP_THREADS", "1")),
    )
    params = SamplingParams.from_dict(sampling())
    engine.generate(texts[:8], params)  # warm-up: first kernels, allocator
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    started = time.perf_counter()
    done = engine.generate(texts, params)
    elapsed = time.perf_counter() - started
    tokens = sum(len(choice.token_ids) for request in done for choice in request.choices)
    return tokens / elapsed, tokens


def generation_step(check: Any, base: str, configs: dict[str, Any], model_dir: Path, kind: str, device: str) -> str:
    if reason := tinylm_missing(model_dir):
        raise Skip(reason)
    facts, on_gpu = check.facts, kind == "KIND_GPU"
    count = 1024 if on_gpu else 128
    texts = prompts(count)
    config = copy.deepcopy(configs["tinylm"])
    config["instance_group"] = gpu_groups(kind, 1)
    served_config = load(base, "tinylm", config)
    _generate_stream(base, texts[0])  # warm-up, and the model answers at all
    served, served_tokens = served_tokens_per_s(base, texts)
    log = Path(check.out / "tritonserver.log").read_text(errors="replace")
    placed = [
        line.split("tinylm instance", 1)[1].strip()[:120] for line in log.splitlines() if "tinylm instance" in line
    ]
    if on_gpu and not any(" on cuda:0" in line for line in placed):
        raise RuntimeError(f"no tinylm instance log line names cuda:0: {placed}")
    inprocess, inprocess_tokens = inprocess_tokens_per_s(model_dir, config, device, texts)
    expected = count * MAX_TOKENS
    if served_tokens != expected or inprocess_tokens != expected:
        raise RuntimeError(
            f"expected {expected} tokens both ways, served {served_tokens}, in process {inprocess_tokens}"
        )
    facts.update(
        generation_triton_tokens_per_s=round(served),
        generation_inprocess_tokens_per_s=round(inprocess),
        generation_vs_inprocess_ratio=round(served / inprocess, 3),
    )
    return (
        f"{groups_text(served_config)}; {count} prompts x {MAX_TOKENS} tokens: served {served:,.0f} tokens/s "
        f"({CLIENTS} streams), in process on {device} {inprocess:,.0f} tokens/s, ratio {served / inprocess:.2f}; "
        f"{placed[-1] if placed else 'no instance log line'}"
    )
