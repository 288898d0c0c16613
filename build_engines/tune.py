"""`python -m build_engines tune SPEC_OR_MODEL`: serve a model at its best shape on this machine.

Like Triton's Model Analyzer, but at the load the control plane offers and with a bounded search: the
model's folder is copied to a scratch repository, one tritonserver loads candidate configs there one after
another (build_engines/tune_measure.py), and a coordinate descent from the hand-written config picks the
candidate with the most rows/s whose p95 call latency meets the bound (build_engines/tune_search.py). The
current config is the baseline and stays unless a candidate beats it by more than the measurement noise. A
decoupled generation engine's shape is its MAX_NUM_SEQS and KV budget, searched for completion tokens/s
(build_engines/tune_generation.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from build_engines.errors import BuildEnginesError, MissingArtefact, SpecError
from build_engines.tune_config import parse, rewrite, shape_of
from build_engines.tune_measure import Load, TuneServer, Workload, copy_model, descendants
from build_engines.tune_search import Limits, SearchResult, Trial, render_table, search, trial_reporter, tune_line

PACKAGE_DIR = Path(__file__).resolve().parent
# The control plane's defaults (controlplane/settings/scheduling.py), repeated because this package runs
# without Django; tests/build_engines/test_tune_search.py holds them equal. A placed instance takes
# SCHEDULER_CALLS_PER_INSTANCE Triton calls in flight, and a shard packs its calls up to max_batch_size rows.
DEFAULT_CONCURRENCY = 6
DEFAULT_BUDGET_S = 120.0


@dataclass(frozen=True)
class Target:
    name: str  # the Triton model name (the folder's)
    model_dir: Path
    texts: list[str] | None  # the spec's corpus, when the model has one
    inputs_from: str  # where the rows come from, in words
    batch_limit: int | None = None  # the most rows a call the model can take (a TensorRT plan's profile)


@dataclass(frozen=True)
class TuneOptions:
    load: Load
    budget_s: float = DEFAULT_BUDGET_S
    max_p95_ms: float | None = None
    min_gain: float = 0.03
    cores: int | None = None
    max_batch_size: int | None = None
    max_instances: int | None = None
    write: bool = False
    out_dir: Path | None = None
    command: str = ""
    # Generation engines: requests in flight (None: 2 x the candidate's MAX_NUM_SEQS) and tokens each asks for.
    sequences_in_flight: int | None = None
    max_tokens: int = 32


@dataclass
class TuneOutcome:
    name: str
    result: SearchResult
    memory: dict[str, int]
    load_seconds: float  # the chosen config's load from cold
    record_path: Path
    config_path: Path
    written: bool
    record: dict[str, Any] = field(default_factory=dict)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _from_spec(names: list[str], folder: str) -> tuple[list[str] | None, int | None]:
    """The corpus of the first of ``names`` that is a tensor spec, and, for its TensorRT folder, the profile's
    largest batch (a plan serves no more rows a call: larger candidates would only fail to load)."""
    from build_engines.spec import ModelSpec, load_any_spec

    for name in names:
        try:
            spec = load_any_spec(name)
        except (BuildEnginesError, OSError):
            continue
        if not isinstance(spec, ModelSpec):
            continue
        texts = None
        if spec.text is not None and spec.text.corpus.is_file():
            texts = [line for line in spec.text.corpus.read_text("utf-8").splitlines() if line.strip()] or None
        batch_axis = spec.inputs[0].shape[0] if spec.inputs else None
        limit = spec.profile.get("max", {}).get(batch_axis) if isinstance(batch_axis, str) else None
        return texts, limit if folder.endswith("_trt") else None
    return None, None


def resolve_target(target: str, models_dir: Path) -> Target:
    """A model folder, a model name in ``models_dir``, or a spec (its emitted folder for this machine)."""
    from build_engines.spec import ModelSpec, load_any_spec

    path = Path(target)
    if (path / "config.pbtxt").is_file():
        model_dir = path.resolve()
    elif (models_dir / target / "config.pbtxt").is_file():
        model_dir = (models_dir / target).resolve()
    else:
        try:
            spec = load_any_spec(target)
        except SpecError as exc:
            if exc.fields != ["<file>"]:
                raise
            where = f"no model folder at {target}, no model {target!r} in {models_dir}, and no spec of that name"
            raise SpecError(target, [("target", where)]) from exc
        from deploy.local.triton_server import has_nvidia_gpu

        if not isinstance(spec, ModelSpec):  # a generation spec: its engine's folder has the spec's name
            folder = spec.name
        else:
            folder = f"{spec.name}_trt" if has_nvidia_gpu() else f"{spec.name}_ort"
        model_dir = (models_dir / folder).resolve()
        if not (model_dir / "config.pbtxt").is_file():
            raise MissingArtefact(f"{model_dir} has no config.pbtxt: run `python -m build_engines emit {target}`")
    name = model_dir.name
    texts, batch_limit = _from_spec([name, name.rsplit("_", 1)[0]], name)
    inputs_from = f"spec corpus ({len(texts)} texts)" if texts else "synthetic rows"
    return Target(name, model_dir, texts, inputs_from, batch_limit)


def with_corpus(target: Target, path: Path) -> Target:
    """``target`` sending the texts of ``path`` (one a line, blank lines skipped) instead of its spec's corpus."""
    try:
        texts = [line for line in path.read_text("utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, [("--corpus", f"cannot be read: {exc}")]) from None
    if not texts:
        raise SpecError(path, [("--corpus", "holds no text")])
    return replace(target, texts=texts, inputs_from=f"{path} ({len(texts)} texts)")


def tune(target: Target, options: TuneOptions, *, echo: Callable[[str], None] = print) -> TuneOutcome:
    config_path = target.model_dir / "config.pbtxt"
    base_text = config_path.read_text()
    config = parse(base_text, config_path)
    cores = options.cores or _cores()
    if config.model_transaction_policy.decoupled:
        return _tune_generation(target, options, base_text, cores, echo)
    if config.max_batch_size <= 0:
        raise SpecError(config_path, [("max_batch_size", "tune serves models Triton batches (max_batch_size > "
                                       "0) and decoupled generation engines")])  # fmt: skip
    baseline = shape_of(config)
    limits = Limits(
        cores=cores,
        max_batch_size=options.max_batch_size or min(4 * baseline.max_batch_size, target.batch_limit or 1 << 30),
        max_instances=options.max_instances or cores,
        max_p95_ms=options.max_p95_ms,
        min_gain=options.min_gain,
    )
    call_rows = (
        "the preferred (else max) batch size's" if options.load.call_rows is None else str(options.load.call_rows)
    )
    echo(
        f"tuning {target.name} ({config_path}) on {cores} cores: {options.load.concurrency} calls in flight of "
        f"{call_rows} rows, {target.inputs_from}; budget {options.budget_s:g} s"
    )
    workload = Workload(config, target.texts, options.load.dynamic_dim)

    report = trial_reporter(echo)

    with tempfile.TemporaryDirectory(prefix=f"tune-{target.name}-") as scratch:
        repository = Path(scratch) / "models"
        repository.mkdir()
        copy_model(target.model_dir, repository)
        with TuneServer(repository, target.name, base_text, Path(scratch) / "tritonserver.log") as server:
            result = search(
                baseline,
                lambda shape: server.measure(shape, workload, options.load),
                limits,
                budget_s=options.budget_s,
                clock=time.monotonic,
                report=report,
            )
            memory, load_s = _chosen_memory(server, result, workload, options.load)
    echo(render_table(result))
    chosen_text = lambda: rewrite(base_text, result.chosen.shape)  # noqa: E731
    return _finish(target, options, result, memory, load_s, chosen_text, tune_line(target.name, result), echo)


def _tune_generation(
    target: Target, options: TuneOptions, base_text: str, cores: int, echo: Callable[[str], None]
) -> TuneOutcome:
    from build_engines.tune_generation import rewrite_generation, search_generation

    result, memory, load_s = search_generation(target, options, base_text, cores, echo)
    echo(render_table(result, "tokens/s"))
    chosen_text = lambda: rewrite_generation(base_text, result.chosen.shape)  # noqa: E731
    line = tune_line(target.name, result, "tokens")
    return _finish(target, options, result, memory, load_s, chosen_text, line, echo)


def _finish(
    target: Target,
    options: TuneOptions,
    result: SearchResult[Any],
    memory: dict[str, int],
    load_s: float,
    chosen_text: Callable[[], str],
    line: str,
    echo: Callable[[str], None],
) -> TuneOutcome:
    """--write's rewrite when a candidate won (``chosen_text``: the config with its shape), tune.json, the
    TUNE line."""
    config_path = target.model_dir / "config.pbtxt"
    written = False
    if options.write and result.chosen.shape != result.baseline.shape:
        temporary = config_path.with_name(".config.pbtxt.tune")
        temporary.write_text(chosen_text())
        os.replace(temporary, config_path)
        written = True
        echo(f"wrote {config_path}")
    elif options.write:
        echo(f"{config_path} unchanged: the current config is the best measured")
    out_dir = options.out_dir or PACKAGE_DIR / "out" / target.name
    record = tune_record(target, options, result, memory, written) | {"chosen_load_s": load_s}
    out_dir.mkdir(parents=True, exist_ok=True)
    record_path = out_dir / "tune.json"
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    echo(f"record {record_path}")
    echo(line)
    return TuneOutcome(target.name, result, memory, load_s, record_path, config_path, written, record)


def _chosen_memory(
    server: TuneServer, result: SearchResult, workload: Workload, load: Load
) -> tuple[dict[str, int], float]:
    """Memory of the chosen config alone, and its load time from cold: unload, wait for the old stubs to go,
    load it, run a short load (activations count)."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.unload_model(server.name)
    except InferenceServerException as exc:
        raise BuildEnginesError(f"tritonserver did not unload {server.name}: {exc}") from exc
    finally:
        client.close()
    deadline = time.monotonic() + 15.0
    while any(True for _ in descendants(server.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    shape = result.chosen.shape
    fresh = server.measure(shape, workload, Load(load.concurrency, load.call_rows, 0.0, min(1.0, load.measure_s)))
    return server.memory(shape.instances), fresh.load_s


def _trial(trial: Trial) -> dict[str, Any]:
    return {"index": trial.index, "shape": asdict(trial.shape), "note": trial.note, **asdict(trial.measurement)}


def tune_record(
    target: Target, options: TuneOptions, result: SearchResult, memory: dict[str, int], written: bool
) -> dict[str, Any]:
    from deploy.local.triton_server import has_nvidia_gpu

    return {
        "model": target.name,
        "model_dir": str(target.model_dir),
        "inputs": target.inputs_from,
        "machine": {"cores": result.cores, "cpu_count": os.cpu_count(), "nvidia_gpu": has_nvidia_gpu()},
        "load": asdict(options.load),
        "budget_s": options.budget_s,
        "noise": result.noise,
        "p95_bound_ms": result.bound_ms,
        "baseline": _trial(result.baseline),
        "trials": [_trial(t) for t in result.trials],
        "chosen": _trial(result.chosen),
        "gain": result.gain,
        "stopped_by_budget": result.stopped_by_budget,
        "memory": memory,
        "written": written,
        "command": options.command,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
