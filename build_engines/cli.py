"""`python -m build_engines {export,verify,build,emit,all} SPEC`, `tune SPEC_OR_MODEL`, `validate-configs` and
`adapter {check,add} BASE_MODEL_DIR PEFT_DIR --name NAME` (LoRA adapters: build_engines/adapters.py).

Exit codes: 0 ok, 1 other failure (e.g. an artefact a step needs is missing), 2 bad spec or bad config, 3 verify
failed, 4 cannot run on this machine. Errors print as one `error:` block on stderr, never a traceback,
because the message (which names the spec field to fix) is the useful part.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from build_engines.errors import BuildEnginesError, CannotRunHere, SpecError
from build_engines.generation_spec import GenerationSpec
from build_engines.spec import ModelSpec, load_any_spec

PACKAGE_DIR = Path(__file__).resolve().parent
# Keep a build hermetic: weights come from installed packages, never from a model hub download.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # weight-loading bars drown the parity table


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m build_engines", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    help_text = {
        "export": "torch -> ONNX (checked with onnx.checker)",
        "verify": "ONNX Runtime CPU vs torch at min/opt/max shapes and on the spec's corpus",
        "build": "ONNX -> TensorRT plan per precision (needs an NVIDIA GPU and tensorrt)",
        "emit": "write Triton model folders (<name>_onnx, <name>_trt, <name>_ort; generation: <name>_vllm or _trtllm)",
        "all": "export, verify, emit, then build (a build that cannot run here is reported, not fatal)",
    }
    for name, text in help_text.items():
        sub = commands.add_parser(name, help=text, description=text)
        sub.add_argument("spec", help="spec file, or a model name from build_engines/specs/")
        sub.add_argument("--out", type=Path, help="artefact directory (default build_engines/out/<name>/)")
        if name in ("verify", "all"):
            sub.add_argument("--seed", type=int, help="replay the random inputs of an earlier run")
            sub.add_argument(
                "--shape",
                action="append",
                default=[],
                metavar="AXIS=N[,AXIS=N]",
                help="also verify at these axis sizes (must lie inside the profile)",
            )
        if name in ("build", "all"):
            sub.add_argument(
                "--precision",
                action="append",
                choices=("fp32", "fp16"),
                help="build only this precision (repeatable; default: all in the spec)",
            )
        if name in ("emit", "all", "build"):
            sub.add_argument("--models-dir", type=Path, help="Triton model repository (default triton_models/)")
        if name == "all":
            sub.add_argument(
                "--require-trt", action="store_true", help="fail (exit 4) when the TensorRT build cannot run here"
            )
    _add_tune(commands)
    _add_adapter(commands)
    validate = commands.add_parser("validate-configs", help="parse every config.pbtxt with Triton's schema")
    validate.add_argument("--models-dir", type=Path, help="Triton model repository (default triton_models/)")
    return parser


def _add_tune(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from build_engines.tune import DEFAULT_BUDGET_S, DEFAULT_CONCURRENCY

    text = "search served shapes (batch, queue delay, instances, threads) for the most rows/s on this machine"
    tune = commands.add_parser(
        "tune",
        help=text,
        description=text + ". The load is the control plane's: --concurrency calls in flight (default "
        f"{DEFAULT_CONCURRENCY}, SCHEDULER_CALLS_PER_INSTANCE's default: one placed instance's cap) of --call-rows "
        "rows (default the candidate's largest preferred batch size, else its max_batch_size, as a shard packs its "
        "calls for a tuned config); set both to the deployment's "
        "values where they differ. A decoupled generation engine's MAX_NUM_SEQS and KV_BUDGET_TOKENS are searched "
        "for completion tokens/s instead, at 2x the candidate's MAX_NUM_SEQS requests in flight (as the control "
        "plane offers) of --max-tokens tokens.",
    )
    tune.add_argument(
        "target", help="spec file or name (its emitted folder), model name in --models-dir, or a model folder"
    )
    tune.add_argument("--models-dir", type=Path, help="Triton model repository (default triton_models/)")
    tune.add_argument(
        "--corpus",
        type=Path,
        help="texts to send, one a line, in place of the spec's corpus (the texts the model will serve: a "
        "shape's speed depends on their lengths)",
    )
    tune.add_argument("--out", type=Path, help="where tune.json goes (default build_engines/out/<model>/)")
    tune.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="stop trying candidates after this")
    tune.add_argument("--max-p95-ms", type=float, help="latency bound on a call's p95 (default 2x the baseline's)")
    tune.add_argument(
        "--concurrency",
        type=int,
        help=f"calls in flight (default {DEFAULT_CONCURRENCY}; generation: requests, default 2x MAX_NUM_SEQS)",
    )
    tune.add_argument("--max-tokens", type=int, default=32, help="tokens a generation request asks for")
    tune.add_argument(
        "--call-rows",
        type=int,
        help="rows a call (default: the candidate's largest preferred batch size, else its max_batch_size, as the "
        "control plane packs for a tuned config)",
    )
    tune.add_argument("--warmup-s", type=float, default=1.0, help="load offered before measuring each candidate")
    tune.add_argument("--measure-s", type=float, default=3.0, help="measured window per candidate")
    tune.add_argument("--min-gain", type=float, default=0.03, help="least relative gain that replaces the baseline")
    tune.add_argument(
        "--max-batch-size",
        type=int,
        help="largest max_batch_size (generation: MAX_NUM_SEQS) tried (default 4x the current)",
    )
    tune.add_argument("--max-instances", type=int, help="most instances tried (default the cores)")
    tune.add_argument("--cores", type=int, help="cores to plan for: instances x threads <= cores (default this host's)")
    tune.add_argument("--write", action="store_true", help="rewrite the model's config.pbtxt with the choice")


def _add_adapter(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    adapter = commands.add_parser("adapter", help="check a PEFT LoRA adapter against its base, copy it in")
    actions = adapter.add_subparsers(dest="action", required=True)
    for action, text in (
        ("check", "check a PEFT LoRA directory against the base model directory"),
        ("add", "check, then copy it to the base's adapters/ folder (the engine's ADAPTERS_DIR)"),
    ):
        sub = actions.add_parser(action, help=text, description=text)
        sub.add_argument(
            "base_dir", type=Path, help="the base's Hugging Face directory (e.g. triton_models/tinylm/1/hf)"
        )
        sub.add_argument("peft_dir", type=Path, help="the adapter: adapter_config.json + adapter_model.safetensors")
        sub.add_argument("--name", required=True, help="the adapter's name; tenants write `<base model>:<name>`")
        if action == "add":
            sub.add_argument("--adapters-dir", type=Path, help="where it goes (default: adapters/ beside base_dir)")


def _adapter(args: argparse.Namespace) -> int:
    from build_engines.adapters import adapter_add, adapter_check

    if args.action == "check":
        info = adapter_check(args.base_dir, args.peft_dir, name=args.name)
    else:
        info = adapter_add(args.base_dir, args.peft_dir, name=args.name, adapters_dir=args.adapters_dir)
    print(
        f"{'added' if args.action == 'add' else 'checked'} {info.name}: r={info.rank} alpha={info.alpha:g} "
        f"{info.modules} LoRA layers ({', '.join(info.target_modules)}) at {info.path}"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = "python -m build_engines " + shlex.join(sys.argv[1:] if argv is None else argv)
    try:
        return _run(args, command)
    except BuildEnginesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _run(args: argparse.Namespace, command: str) -> int:
    from build_engines.emit import DEFAULT_MODELS_DIR

    if args.command == "validate-configs":
        from build_engines.validate import validate_model_repository

        models_dir = args.models_dir or DEFAULT_MODELS_DIR
        errors = validate_model_repository(models_dir)
        for error in errors:
            print(f"error: {error}", file=sys.stderr)
        print(f"{models_dir}: {'OK' if not errors else f'{len(errors)} problem(s)'}")
        return 2 if errors else 0

    if args.command == "tune":
        return _tune(args, command)
    if args.command == "adapter":
        return _adapter(args)

    spec = load_any_spec(args.spec)
    out_dir = (args.out or PACKAGE_DIR / "out" / spec.name).resolve()
    if not isinstance(spec, ModelSpec):
        return _run_generation(spec, out_dir, args, command)
    steps = {"export": _export, "verify": _verify, "emit": _emit, "build": _build}
    if args.command != "all":
        return steps[args.command](spec, out_dir, args, command)
    for name in ("export", "verify", "emit"):
        print(f"== {name}")
        steps[name](spec, out_dir, args, command)
    print("== build")
    try:
        return _build(spec, out_dir, args, command)
    except CannotRunHere as exc:
        if args.require_trt:
            raise
        print(f"skipped: {exc}")
        return 0


def _run_generation(spec: GenerationSpec, out_dir: Path, args: argparse.Namespace, command: str) -> int:
    """Generation specs: emit writes the Triton folder and manifest; build is TensorRT-LLM's engine build."""
    from build_engines.emit import DEFAULT_MODELS_DIR
    from build_engines.emit_generation import build_generation, emit_generation

    models_dir = args.models_dir if getattr(args, "models_dir", None) else DEFAULT_MODELS_DIR
    if args.command in ("export", "verify"):
        raise SpecError(
            spec.path,
            [("generation", f"`{args.command}` is for tensor models; a generation model is served from its "
              "Hugging Face directory as is (use emit, build or all)")],
        )  # fmt: skip
    if args.command in ("emit", "all"):
        print(f"emitted {emit_generation(spec, out_dir, models_dir, command=command)}")
    if args.command == "emit":
        return 0
    try:
        for built in build_generation(spec, out_dir, models_dir):
            print(f"built {built}")
    except CannotRunHere as exc:
        if args.command == "build" or args.require_trt:
            raise
        print(f"skipped: {exc}")
    return 0


def _export(spec: ModelSpec, out_dir: Path, args: argparse.Namespace, command: str) -> int:
    from build_engines.export import export_onnx

    path = export_onnx(spec, out_dir, command=command)
    print(f"exported {path} (opset {spec.opset})")
    return 0


def _verify(spec: ModelSpec, out_dir: Path, args: argparse.Namespace, command: str) -> int:
    from build_engines.verify import verify_onnx

    verify_onnx(spec, out_dir, command=command, seed=args.seed, extra_sizes=_parse_shapes(spec, args.shape))
    return 0


def _emit(spec: ModelSpec, out_dir: Path, args: argparse.Namespace, command: str) -> int:
    from build_engines.emit import DEFAULT_MODELS_DIR, emit_models

    for folder in emit_models(spec, out_dir, args.models_dir or DEFAULT_MODELS_DIR):
        print(f"emitted {folder}")
    return 0


def _build(spec: ModelSpec, out_dir: Path, args: argparse.Namespace, command: str) -> int:
    from build_engines.trt_build import build_plans

    for plan in build_plans(
        spec, out_dir, command=command, precisions=args.precision, seed=getattr(args, "seed", None) or 0
    ):
        print(f"built {plan}")
    return 0


def _parse_shapes(spec: ModelSpec, values: list[str]) -> list[dict[str, int]]:
    shapes = []
    for value in values:
        sizes: dict[str, int] = {}
        for part in value.split(","):
            axis, _, size = part.partition("=")
            if not size.strip().isdigit():
                raise SpecError(spec.path, [("--shape", f"expected AXIS=N[,AXIS=N], got {value!r}")])
            sizes[axis.strip()] = int(size)
        shapes.append(sizes)
    return shapes


def _tune(args: argparse.Namespace, command: str) -> int:
    from build_engines.emit import DEFAULT_MODELS_DIR
    from build_engines.tune import DEFAULT_CONCURRENCY, TuneOptions, resolve_target, tune, with_corpus
    from build_engines.tune_measure import Load

    positive = {"--budget-s": args.budget_s, "--concurrency": args.concurrency, "--measure-s": args.measure_s}
    positive |= {"--max-tokens": args.max_tokens}
    positive |= {"--call-rows": args.call_rows, "--max-batch-size": args.max_batch_size}
    positive |= {"--max-instances": args.max_instances, "--cores": args.cores, "--max-p95-ms": args.max_p95_ms}
    bad = [(flag, f"must be > 0, got {value}") for flag, value in positive.items() if value is not None and value <= 0]
    bad += [("--warmup-s", "must be >= 0")] if args.warmup_s < 0 else []
    if bad:
        raise SpecError("tune", bad)
    target = resolve_target(args.target, args.models_dir or DEFAULT_MODELS_DIR)
    if args.corpus is not None:
        target = with_corpus(target, args.corpus)
    load = Load(args.concurrency or DEFAULT_CONCURRENCY, args.call_rows, args.warmup_s, args.measure_s)
    options = TuneOptions(
        load=load,
        budget_s=args.budget_s,
        max_p95_ms=args.max_p95_ms,
        min_gain=args.min_gain,
        cores=args.cores,
        max_batch_size=args.max_batch_size,
        max_instances=args.max_instances,
        write=args.write,
        out_dir=args.out,
        command=command,
        sequences_in_flight=args.concurrency,
        max_tokens=args.max_tokens,
    )
    tune(target, options)
    return 0
