"""The in-process ceiling, honestly: the best configuration of the served runtime in one process, chosen from a
sweep rather than fixed. The sweep runs batch sizes up to the model's max_batch_size, intra-op threads up to
the cores, length-sorted and unsorted, and sorted with the served model's padding cut (a batch also ends where
padding would pass PADDING_CUT × its real tokens: triton_models/minilm), on a sample of the corpus, in one
child process (torch's thread count is process-wide); the best configuration is then measured on the whole
corpus wherever a ratio needs the ceiling. Used by bench/run.py; printed with the sweep it was chosen from."""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass

# The served minilm's cut on a CPU (triton_models/minilm/1/model.py).
PADDING_CUT = 1.1


@dataclass(frozen=True)
class Config:
    batch_size: int
    threads: int
    sort_by_length: bool
    max_padding: float | None = None  # sorted only

    def label(self) -> str:
        order = "sorted" if self.sort_by_length else "unsorted"
        cut = f", padding cut {self.max_padding:g}x" if self.max_padding else ""
        return f"batch {self.batch_size}, {self.threads} thread(s), {order}{cut}"


def sweep_configs(*, max_batch: int, cores: int | None = None) -> list[Config]:
    """Batch sizes 8 … max_batch (powers of two), threads 1 … cores; unsorted, sorted, sorted with the padding cut."""
    cores = cores or os.cpu_count() or 1
    batches, size = [], 8
    while size < max_batch:
        batches.append(size)
        size *= 2
    batches.append(max_batch)
    threads = sorted({1, *range(2, cores + 1)})
    orders = [(True, None), (True, PADDING_CUT), (False, None)]
    return [Config(b, t, s, cut) for b in batches for t in threads for s, cut in orders]


def _texts_per_second(texts: list[str], runtime: str, config: Config, *, models: dict) -> float:
    from deploy.local.inprocess import InProcessMiniLM

    model = models.get(config.threads)
    if model is None:
        model = models[config.threads] = InProcessMiniLM(threads=config.threads, runtime=runtime)
        model.embed(texts[: config.batch_size])  # warm-up: first-call allocations, lazy kernels
    start = time.perf_counter()
    model.embed(
        texts, batch_size=config.batch_size, sort_by_length=config.sort_by_length, max_padding=config.max_padding
    )
    return len(texts) / (time.perf_counter() - start)


def _sweep(texts: list[str], runtime: str, configs: list[Config]) -> list[tuple[Config, float]]:
    models: dict = {}
    return [(config, _texts_per_second(texts, runtime, config, models=models)) for config in configs]


def _measure(texts: list[str], runtime: str, config: Config) -> float:
    return _texts_per_second(texts, runtime, config, models={})


def _child():
    return multiprocessing.get_context("spawn").Pool(1)


def sweep(texts: list[str], runtime: str, configs: list[Config]) -> list[tuple[Config, float]]:
    """Each configuration's texts/s on ``texts``, best first."""
    with _child() as pool:
        results = pool.apply(_sweep, (texts, runtime, configs))
    return sorted(results, key=lambda result: -result[1])


def measure(texts: list[str], runtime: str, config: Config) -> float:
    """One configuration's texts/s on ``texts``, in a fresh child process."""
    with _child() as pool:
        return pool.apply(_measure, (texts, runtime, config))


def print_sweep(results: list[tuple[Config, float]], *, served: Config, sample: int) -> None:
    print(f"  ceiling sweep on {sample} texts (best first; the served shape is marked *):")
    for config, rate in results:
        mark = "*" if config == served else " "
        print(f"   {mark} {config.label():<40}{rate:>8.1f} texts/s")
