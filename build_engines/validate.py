"""Check a Triton model repository the way Triton will read it, before Triton refuses a model at load time.

Each config.pbtxt is parsed with Triton's own schema (tritonclient's generated ModelConfig), so a typo'd
field fails here with a line and column instead of in a server log on a GPU host. Configs of the vLLM and
TensorRT-LLM backends are also checked against those backends' vendored keys (backend_keys.py).
"""

from __future__ import annotations

from pathlib import Path


def validate_model_repository(path: str | Path) -> list[str]:
    """Return one message per problem (empty when the repository is fine); never raises on bad content."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    root = Path(path)
    if not root.is_dir():
        return [f"{root}: not a directory"]
    errors: list[str] = []
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))):
        config_path = model_dir / "config.pbtxt"
        if not config_path.is_file():
            errors.append(f"{model_dir.name}: no config.pbtxt")
            continue
        config = pb.ModelConfig()
        try:
            text_format.Parse(config_path.read_text("utf-8"), config)
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            errors.append(f"{model_dir.name}/config.pbtxt: {exc}")
            continue
        errors.extend(f"{model_dir.name}/config.pbtxt: {problem}" for problem in _check(model_dir, config))
    return errors


def _check(model_dir: Path, config: object) -> list[str]:
    problems = []
    name = config.name  # type: ignore[attr-defined]
    if name and name != model_dir.name:
        problems.append(f"name {name!r} does not match its folder {model_dir.name!r}")
    versions = sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit())
    if not versions:
        problems.append("no numeric version folder (e.g. 1/)")
    backend, platform = config.backend, config.platform  # type: ignore[attr-defined]
    if not backend and not platform:
        problems.append("neither backend nor platform is set")
    # The GPU generation backends cannot load here: check them against their vendored key lists instead.
    if backend == "vllm":
        from build_engines.backend_keys import vllm_config_problems

        problems.extend(vllm_config_problems(config, versions))
    if backend == "tensorrtllm":
        from build_engines.backend_keys import trtllm_config_problems

        problems.extend(trtllm_config_problems(config))
    if backend == "python":
        filename = config.default_model_filename or "model.py"  # type: ignore[attr-defined]
        problems.extend(f"{v.name}/{filename} is missing" for v in versions if not (v / filename).is_file())
    max_batch = config.max_batch_size  # type: ignore[attr-defined]
    if max_batch < 0:
        problems.append(f"max_batch_size must be >= 0, got {max_batch}")
    if config.HasField("dynamic_batching"):  # type: ignore[attr-defined]
        if max_batch == 0:
            problems.append("dynamic_batching needs max_batch_size > 0")
        too_big = [s for s in config.dynamic_batching.preferred_batch_size if s > max_batch]  # type: ignore[attr-defined]
        if max_batch and too_big:
            problems.append(f"preferred_batch_size {too_big} exceeds max_batch_size {max_batch}")
    for kind, tensors in (("input", config.input), ("output", config.output)):  # type: ignore[attr-defined]
        seen = set()
        for tensor in tensors:
            if tensor.name in seen:
                problems.append(f"duplicate {kind} {tensor.name!r}")
            seen.add(tensor.name)
            if tensor.data_type == 0:  # TYPE_INVALID: the field was left out
                problems.append(f"{kind} {tensor.name!r} has no data_type")
            if not tensor.dims and not tensor.HasField("reshape"):
                problems.append(f"{kind} {tensor.name!r} has no dims")
    return problems
