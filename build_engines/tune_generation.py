"""`python -m build_engines tune` for a decoupled generation engine: how many sequences it decodes at once.

Such an engine (triton_models/tinylm) batches sequences itself between decode steps, so Triton's batching
fields mean nothing to it; its served shape is two config parameters: MAX_NUM_SEQS (sequences decoding at
once) and KV_BUDGET_TOKENS (the KV cache, in tokens). The search (tune_search.search with the axes below)
halves and doubles MAX_NUM_SEQS with the KV budget following it, so every candidate keeps the baseline's KV
tokens per sequence (what a sequence at the model's context needs), and tries a larger budget alone. The
load is the control plane's, 2 x the candidate's MAX_NUM_SEQS requests in flight (build_engines/tune_stream.py),
and the figure is completion tokens/s; the same rules as a batching model's decide (noise, confirmation, p95
bound, budget, the current config kept unless beaten).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from build_engines.errors import SpecError
from build_engines.tune_config import parse, set_parameter
from build_engines.tune_measure import TuneServer, copy_model
from build_engines.tune_search import Measurement, SearchResult, search, trial_reporter
from build_engines.tune_stream import SYNTHETIC_PROMPTS, GenerationLoad, offer_generation_load

if TYPE_CHECKING:
    from build_engines.tune import Target, TuneOptions

SEQS_KEY = "MAX_NUM_SEQS"
KV_KEY = "KV_BUDGET_TOKENS"


@dataclass(frozen=True)
class GenerationShape:
    max_num_seqs: int
    kv_budget_tokens: int

    def describe(self) -> str:
        return f"seqs={self.max_num_seqs} kv={self.kv_budget_tokens}"


@dataclass(frozen=True)
class GenerationLimits:
    cores: int
    max_num_seqs: int  # the most sequences tried
    kv_per_seq: int  # KV tokens a sequence needs: the baseline's budget / its MAX_NUM_SEQS
    max_kv_budget_tokens: int  # the largest budget tried (memory: the engine allocates it whole)
    max_p95_ms: float | None = None
    min_gain: float = 0.03


def generation_shape_of(config: Any, path: object = "config.pbtxt") -> GenerationShape:
    values = {}
    for key in (SEQS_KEY, KV_KEY):
        text = config.parameters[key].string_value.strip() if key in config.parameters else ""
        if not text.isdigit() or int(text) <= 0:
            raise SpecError(path, [(key, "a generation engine's tune needs this parameter as a positive integer")])
        values[key] = int(text)
    return GenerationShape(values[SEQS_KEY], values[KV_KEY])


def rewrite_generation(text: str, shape: GenerationShape) -> str:
    """``text`` with MAX_NUM_SEQS and KV_BUDGET_TOKENS set to ``shape``, every other line as it was."""
    out = set_parameter(set_parameter(text, SEQS_KEY, str(shape.max_num_seqs)), KV_KEY, str(shape.kv_budget_tokens))
    if generation_shape_of(parse(out)) != shape:
        raise SpecError("config.pbtxt", [("parameters", f"the rewrite does not read as {shape.describe()}")])
    return out


def _seqs_moves(shape: GenerationShape, limits: GenerationLimits, baseline: GenerationShape) -> list[GenerationShape]:
    """Half and twice the sequences, the KV budget scaled with them: each keeps the incumbent's headroom."""
    return [
        GenerationShape(seqs, shape.kv_budget_tokens * seqs // shape.max_num_seqs)
        for seqs in (shape.max_num_seqs // 2, shape.max_num_seqs * 2)
    ]


def _budget_moves(shape: GenerationShape, limits: GenerationLimits, baseline: GenerationShape) -> list[GenerationShape]:
    """Twice the KV budget alone: room for the prefix cache to keep more shared prompt blocks."""
    return [replace(shape, kv_budget_tokens=2 * shape.kv_budget_tokens)]


GENERATION_AXES = (_seqs_moves, _budget_moves)


def valid_generation(shape: GenerationShape, limits: GenerationLimits) -> bool:
    return (
        1 <= shape.max_num_seqs <= limits.max_num_seqs
        and shape.max_num_seqs * limits.kv_per_seq <= shape.kv_budget_tokens <= limits.max_kv_budget_tokens
    )


def generation_limits(baseline: GenerationShape, cores: int, options: TuneOptions) -> GenerationLimits:
    most = options.max_batch_size or 4 * baseline.max_num_seqs
    per_seq = max(1, baseline.kv_budget_tokens // baseline.max_num_seqs)
    return GenerationLimits(
        cores=cores,
        max_num_seqs=most,
        kv_per_seq=per_seq,
        max_kv_budget_tokens=max(baseline.kv_budget_tokens, most * per_seq) * 2,
        max_p95_ms=options.max_p95_ms,
        min_gain=options.min_gain,
    )


def search_generation(
    target: Target, options: TuneOptions, base_text: str, cores: int, echo: Callable[[str], None]
) -> tuple[SearchResult[GenerationShape], dict[str, int], float]:
    """The search on one tritonserver over a scratch copy of the model; the result, the chosen config's memory
    and its load from cold."""
    baseline = generation_shape_of(parse(base_text), target.model_dir / "config.pbtxt")
    limits = generation_limits(baseline, cores, options)
    load = GenerationLoad(
        options.sequences_in_flight, options.max_tokens, options.load.warmup_s, options.load.measure_s
    )
    prompts = target.texts or list(SYNTHETIC_PROMPTS)
    in_flight = "2 x the candidate's MAX_NUM_SEQS" if load.in_flight is None else str(load.in_flight)
    source = target.inputs_from if target.texts else f"synthetic prompts ({len(prompts)})"
    echo(
        f"tuning {target.name} (generation: {SEQS_KEY}, {KV_KEY}) on {cores} cores: {in_flight} requests in "
        f"flight of {load.max_tokens} tokens, {source}; budget {options.budget_s:g} s"
    )

    report = trial_reporter(echo, "tokens/s")

    with tempfile.TemporaryDirectory(prefix=f"tune-{target.name}-") as scratch:
        repository = Path(scratch) / "models"
        repository.mkdir()
        copy_model(target.model_dir, repository)
        with TuneServer(repository, target.name, base_text, Path(scratch) / "tritonserver.log") as server:

            def measure(shape: GenerationShape, measure_s: float = load.measure_s) -> Measurement:
                from tritonclient.utils import InferenceServerException

                try:
                    load_s = server.load_config(rewrite_generation(base_text, shape))
                except InferenceServerException as exc:
                    return Measurement(0.0, 0.0, error=f"load failed: {str(exc).strip().splitlines()[0][:300]}")
                in_flight = load.in_flight or 2 * shape.max_num_seqs
                measured = offer_generation_load(
                    server.url, server.name, prompts, replace(load, measure_s=measure_s), in_flight
                )
                return replace(measured, load_s=load_s)

            result = search(
                baseline,
                measure,
                limits,
                budget_s=options.budget_s,
                clock=time.monotonic,
                report=report,
                axes=GENERATION_AXES,
                is_valid=valid_generation,
            )
            # The chosen config loaded once more, for its load time and its stub's memory with a batch running.
            fresh = measure(result.chosen.shape, min(1.0, load.measure_s))
            memory = server.memory(1)
    return result, memory, fresh.load_s
