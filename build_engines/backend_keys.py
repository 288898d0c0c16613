"""Offline checks of the GPU generation backends' configs against their vendored key lists (vendored/).

vLLM reads model.json as `AsyncEngineArgs(**model_json)` and TensorRT-LLM reads config.pbtxt parameters by
name; neither runs here, so without these checks a misspelt key would first fail as a model load on a GPU
host. Every function returns one message per problem and never raises on bad content.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

VENDORED = Path(__file__).resolve().parent / "vendored"


@cache
def vendored(name: str) -> dict[str, Any]:
    return json.loads((VENDORED / name).read_text("utf-8"))  # type: ignore[no-any-return]


@cache
def vllm_engine_args() -> frozenset[str]:
    """Fields in every vendored vLLM snapshot, minus the deprecated and private ones."""
    doc = vendored("vllm_engine_args.json")
    fields = [set(snapshot["fields"]) for snapshot in doc["snapshots"].values()]
    return frozenset(set.intersection(*fields) - set(doc["refused"]))


def model_json_problems(model_json: object) -> list[str]:
    if not isinstance(model_json, dict):
        return ["model.json must be a JSON object (vLLM's engine arguments by name)"]
    refused = vendored("vllm_engine_args.json")["refused"]
    problems = []
    for key in sorted(model_json):
        if key in refused:
            problems.append(f"model.json: {key!r} is refused: {refused[key]}")
        elif key not in vllm_engine_args():
            problems.append(
                f"model.json: {key!r} is not a vLLM engine argument in both vendored snapshots "
                "(build_engines/vendored/vllm_engine_args.json)"
            )
    if "model" not in model_json:
        problems.append("model.json: 'model' (the Hugging Face directory) is missing")
    return problems


def _parameters(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def _tensor_problems(config: Any, doc: dict[str, Any]) -> list[str]:
    from tritonclient.grpc import model_config_pb2 as pb

    problems = []
    for side, tensors in (("input", config.input), ("output", config.output)):
        documented = doc[f"{side}s"]
        for tensor in tensors:
            entry = documented.get(tensor.name)
            if entry is None:
                problems.append(f"{side} {tensor.name!r} is not one the backend documents")
                continue
            data_type, dims = pb.DataType.Name(tensor.data_type), list(tensor.dims)
            if [data_type, dims] != entry[:2]:
                problems.append(f"{side} {tensor.name!r} is {data_type} {dims}, the backend's is {entry[0]} {entry[1]}")
        # An undeclared optional tensor is fine (the vLLM backend auto-completes it); a required input is not.
        required = {name for name, entry in documented.items() if side == "input" and not entry[2]}
        declared = {t.name for t in tensors}
        if declared and (missing := sorted(required - declared)):
            problems.append(f"{side}s {missing} are required by the backend but not declared")
    return problems


def vllm_config_problems(config: Any, version_dirs: list[Path]) -> list[str]:
    from tritonclient.grpc import model_config_pb2 as pb

    doc = vendored("vllm_backend.json")
    problems = _tensor_problems(config, doc)
    if not config.model_transaction_policy.decoupled:
        problems.append("the vLLM backend needs model_transaction_policy { decoupled: true }")
    if config.max_batch_size != 0:
        problems.append(f"max_batch_size must be 0 (vLLM batches itself), got {config.max_batch_size}")
    problems += [
        f"parameter {k!r} is not one the vLLM backend reads"
        for k in sorted(_parameters(config))
        if k not in doc["parameters"]
    ]
    problems += [
        f"parameter {k!r} must be 'true' or 'false', got {v!r}"
        for k, v in sorted(_parameters(config).items())
        if k in doc["parameters"] and v.lower() not in ("true", "false")
    ]
    for version in version_dirs:
        path = version / doc["engine_args_file"]
        if not path.is_file():
            problems.append(f"{version.name}/{path.name} is missing (the vLLM engine arguments)")
            continue
        try:
            model_json = json.loads(path.read_text("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            problems.append(f"{version.name}/{path.name}: not JSON: {exc}")
            continue
        problems += [f"{version.name}/{p}" for p in model_json_problems(model_json)]
        if not isinstance(model_json, dict):
            continue
        gpus = int(model_json.get("tensor_parallel_size", 1)) * int(model_json.get("pipeline_parallel_size", 1))
        kinds = {pb.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group}
        if gpus > 1 and kinds - {"KIND_MODEL"}:
            problems.append(f"{gpus} GPUs per instance need instance_group kind KIND_MODEL, got {sorted(kinds)}")
    return problems


def trtllm_config_problems(config: Any) -> list[str]:
    doc = vendored("tensorrtllm_backend.json")
    problems = _tensor_problems(config, doc)
    parameters = _parameters(config)
    for key, value in sorted(parameters.items()):
        if key not in doc["parameters"]:
            problems.append(f"parameter {key!r} is not in TensorRT-LLM's tensorrt_llm config template")
        elif key in doc["values"] and value not in doc["values"][key]:
            problems.append(f"parameter {key!r} must be one of {doc['values'][key]}, got {value!r}")
        elif key in doc["fractions"]:
            try:
                ok = 0.0 < float(value) <= 1.0
            except ValueError:
                ok = False
            if not ok:
                problems.append(f"parameter {key!r} must be a number within (0, 1], got {value!r}")
    if "gpt_model_path" not in parameters:
        problems.append("parameter 'gpt_model_path' (the documented engine_dir) is missing")
    return problems
