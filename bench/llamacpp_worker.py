"""llama.cpp on the original GGUF, batched over parallel slots, for bench/real_generation.py.

Two sides. In the project's interpreter, ``llamacpp_runs`` builds llama-cpp-python (an sdist: cmake compiles
llama.cpp) once into the benchmark's own virtual environment, var/bench-llamacpp (never ``make install``), and
runs this file there as a worker. The worker imports llama_cpp and the standard library only.

llama-cpp-python's high-level ``Llama`` runs one sequence at a time; the worker drives its low-level binding the
way llama.cpp's server drives a context with ``--parallel``: ``n_seq_max`` slots (each its own KV stream,
``kv_unified`` off), and each ``llama_decode`` carries one token of every generating slot plus prompt tokens of
newly filled slots, up to ``n_batch``. A slot is refilled from the queue as soon as its line ends (EOS or
max_tokens). Greedy with llama.cpp's own greedy sampler. No prefix reuse across slots (the server's
``cache_prompt`` reuses a slot's own previous prompt only, which a corpus of different lines rarely hits).

Worker stdin: one JSON object {"gguf", "prompts": [[token id, ...], ...], "max_tokens", "configs": [[slots,
threads], ...]}. Worker stdout: one JSON line per configuration, {"slots", "threads", "seconds", "tokens",
"outputs"}.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
VENV = REPO_ROOT / "var" / "bench-llamacpp"
LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
ll: Any = None  # llama_cpp, imported by the worker only


# -- the project's side --------------------------------------------------------------------------------------


def llamacpp_python() -> Path | None:
    """The benchmark environment's interpreter with llama_cpp importable, built on first use; None when the
    build failed (the log says why)."""
    python = VENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import llama_cpp"], capture_output=True).returncode == 0:
        return python
    print("building llama-cpp-python (one-time, ~8 min on two cores)…", flush=True)
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    log = VENV / "build.log"
    with log.open("w") as out:
        code = subprocess.run(
            [python, "-m", "pip", "install", "--disable-pip-version-check", LLAMA_CPP_PYTHON],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)},
        ).returncode
    if code != 0:
        print(f"  llama-cpp-python did not build ({log}): llama.cpp is left out", flush=True)
        return None
    print(f"  built in {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return python


def llamacpp_runs(prompts: list[list[int]], max_tokens: int, configs: list[tuple[int, int]]) -> list[dict]:
    """One row per (slots, threads): the worker's result plus a "config" label; [] when llama.cpp is unavailable."""
    sys.path.insert(0, str(REPO_ROOT))
    from build_engines.sources.smollm2 import gguf_path

    python = llamacpp_python()
    if python is None:
        return []
    job = {"gguf": str(gguf_path()), "prompts": prompts, "max_tokens": max_tokens, "configs": configs}
    log = VENV / "worker.log"
    rows = []
    with log.open("w") as errors:
        worker = subprocess.Popen(
            [python, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True
        )
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(json.dumps(job))
        worker.stdin.close()
        for line in worker.stdout:
            row = json.loads(line)
            row["config"] = f"{row['slots']} slots, {row['threads']} threads, batched llama_decode"
            print(f"  llama.cpp {row['config']}: {row['tokens'] / row['seconds']:,.1f} tokens/s", flush=True)
            rows.append(row)
    if worker.wait() != 0:
        print(f"  the llama.cpp worker failed ({log}): {log.read_text()[-600:]}", flush=True)
    return rows


# -- the worker's side (var/bench-llamacpp/bin/python) ----------------------------------------------------------

N_BATCH = 512


_quiet: Any = None  # the log callback, kept referenced while llama.cpp holds its pointer


def _silence() -> None:
    global _quiet
    _quiet = ll.llama_log_callback(lambda level, text, user_data: None)
    ll.llama_log_set(_quiet, ctypes.c_void_p())


class Slots:
    def __init__(self, model, *, slots: int, threads: int, context_per_slot: int) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx = slots * context_per_slot
        params.n_batch = params.n_ubatch = N_BATCH
        params.n_seq_max = slots
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified = False  # each slot its own stream: attention reads only its own KV
        params.no_perf = True
        self.ctx = ll.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(f"llama_init_from_model failed ({slots} slots, n_ctx {params.n_ctx})")
        self.vocab = ll.llama_model_get_vocab(model)
        self.memory = ll.llama_get_memory(self.ctx)
        self.sampler = ll.llama_sampler_init_greedy()
        self.batch = ll.llama_batch_init(N_BATCH, 0, 1)
        self.slots = slots

    def close(self) -> None:
        ll.llama_batch_free(self.batch)
        ll.llama_sampler_free(self.sampler)
        ll.llama_free(self.ctx)

    def run(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Every prompt's generated ids (EOS included, as the other contenders count it), greedy."""
        queue = collections.deque(enumerate(prompts))
        results: list[list[int]] = [[] for _ in prompts]
        # Per slot: [line, prompt ids, prompt tokens fed, generated ids] or None when free.
        active: list[list | None] = [None] * self.slots
        batch = self.batch
        while queue or any(active):
            for seq, slot in enumerate(active):
                if slot is None and queue:
                    line, ids = queue.popleft()
                    ll.llama_memory_seq_rm(self.memory, seq, -1, -1)  # the slot's previous line
                    active[seq] = [line, ids, 0, results[line]]
            n = 0
            outputs: list[tuple[int, int]] = []  # (slot, batch index) whose logits are sampled
            for seq, slot in enumerate(active):  # one token for every generating slot
                if slot is not None and slot[2] == len(slot[1]):
                    ids, out = slot[1], slot[3]
                    n = self._add(n, out[-1], len(ids) + len(out) - 1, seq, True)
                    outputs.append((seq, n - 1))
            for seq, slot in enumerate(active):  # then prompt tokens, in slot order, while the batch has room
                if slot is None or slot[2] == len(slot[1]):
                    continue
                ids, fed = slot[1], slot[2]
                take = min(len(ids) - fed, N_BATCH - n)
                if take <= 0:
                    break
                for pos in range(fed, fed + take):
                    n = self._add(n, ids[pos], pos, seq, pos == len(ids) - 1)
                slot[2] = fed + take
                if slot[2] == len(ids):
                    outputs.append((seq, n - 1))
            batch.n_tokens = n
            code = ll.llama_decode(self.ctx, batch)
            if code != 0:
                raise RuntimeError(f"llama_decode returned {code}")
            for seq, index in outputs:
                slot = active[seq]
                token = ll.llama_sampler_sample(self.sampler, self.ctx, index)
                slot[3].append(token)
                if ll.llama_vocab_is_eog(self.vocab, token) or len(slot[3]) >= max_tokens:
                    active[seq] = None
        return results

    def _add(self, n: int, token: int, pos: int, seq: int, logits: bool) -> int:
        batch = self.batch
        batch.token[n] = token
        batch.pos[n] = pos
        batch.n_seq_id[n] = 1
        batch.seq_id[n][0] = seq
        batch.logits[n] = logits
        return n + 1


def main() -> int:
    global ll
    import llama_cpp as ll

    job = json.load(sys.stdin)
    prompts, max_tokens = job["prompts"], job["max_tokens"]
    _silence()
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(job["gguf"].encode(), ll.llama_model_default_params())
    if not model:
        raise SystemExit(f"could not load {job['gguf']}")
    # Each slot holds its longest line: prompt + max_tokens, rounded up to llama.cpp's 256-cell padding.
    context_per_slot = -(-(max(len(ids) for ids in prompts) + max_tokens) // 256) * 256
    for slots, threads in job["configs"]:
        runner = Slots(model, slots=slots, threads=threads, context_per_slot=context_per_slot)
        try:
            runner.run(prompts[: min(4, len(prompts))], 4)  # warm-up: the first decodes allocate
            started = time.perf_counter()
            outputs = runner.run(prompts, max_tokens)
            seconds = time.perf_counter() - started
        finally:
            runner.close()
        tokens = sum(len(out) for out in outputs)
        print(
            json.dumps({"slots": slots, "threads": threads, "seconds": seconds, "tokens": tokens, "outputs": outputs}),
            flush=True,
        )
    ll.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
