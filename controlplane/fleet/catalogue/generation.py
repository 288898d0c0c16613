"""Catalogue fields for a generation model emitted by `python -m build_engines emit` from a `[generation]` spec.

The manifest says how the engine was configured (context, sequences, tensor parallelism, the memory it holds
per GPU); the emitted config.pbtxt says what Triton will serve, and must speak the interface the generation
kind sends (Triton's vLLM backend's: text in, text out, sampling parameters as JSON). The tokenizer is the
model's own Hugging Face directory, read by the control plane to count prompt tokens and apply the chat
template, so it must be readable where the control plane runs, not only inside the Triton container.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from controlplane.core.http.errors import ValidationFailed
from controlplane.fleet.models import ModelKind

# What kinds/generation/kind.py sends and reads (triton/streaming.py): the vLLM backend's tensors.
GENERATION_INTERFACE = {
    "inputs": {
        "text_input": "BYTES",
        "sampling_parameters": "BYTES",
        "stream": "BOOL",
        "exclude_input_in_output": "BOOL",
    },
    "outputs": {"text_output": "BYTES"},
}
# Declared until the planner measures a load: a vLLM engine starts its workers, loads the weights and
# captures CUDA graphs, a minute or more for a model of billions of parameters.
GENERATION_LOAD_SECONDS = 120.0
# Declared until the first shards settle (scheduling/claims.py smooths the measured figure in): a unit is a
# prompt token or completion_weight x a completion token; tinylm's is 20 µs on 2 CPU cores, a GPU's far less.
GENERATION_SECONDS_PER_WORK_UNIT = 0.00002


def generation_profile(manifest: dict[str, Any]) -> dict[str, Any]:
    """The planner's placement profile from a generation manifest.

    memory_per_instance_bytes is per GPU, as the planner reads it (a gang instance holds that much on each
    of its gpus_per_instance GPUs), and includes the KV budget the engine preallocates."""
    return {
        "memory_per_instance_bytes": int(manifest["memory_per_gpu_bytes"]),
        "gpus_per_instance": int(manifest["gpus_per_instance"]),
        "pool": str(manifest["pool"]),
        "load_seconds": GENERATION_LOAD_SECONDS,
        "seconds_per_work_unit": GENERATION_SECONDS_PER_WORK_UNIT,
    }


def generation_interface(
    manifest: dict[str, Any],
    *,
    triton_name: str,
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    repository: Path,
    tokenizer_dir: Path | None,
) -> dict[str, Any]:
    """The fields registration refreshes on every run (what the emitted model is), after checking that the
    generation kind can drive it and that its tokenizer is readable here."""
    if manifest.get("engine") != "vllm":
        raise ValidationFailed(
            f"{triton_name} is a {manifest.get('engine')} model: its Triton model takes token ids, and the "
            "generation kind sends text (the vLLM backend's interface); register the vLLM emit of the same "
            'spec (engine = "vllm"), or wire TensorRT-LLM\'s pre/post-processing ensemble first '
            "(docs/architecture/generation.md, GPU engines).",
            param="triton_name",
        )
    _check_interface(triton_name, inputs, outputs)
    return {
        "triton_name": triton_name,
        "kind": ModelKind.GENERATION,
        # Triton does not batch the requests (decoupled, max_batch_size 0): one line is one request, and the
        # engine batches between decode steps.
        "max_batch_size": 1,
        "inputs": inputs,
        "outputs": outputs,
        "embedding_dimensions": None,
        "context_length": int(manifest["context_length"]),
        "max_num_seqs": int(manifest["max_num_seqs"]),
        "structured_outputs": bool(manifest.get("structured_outputs")),
        "tokenizer_dir": _tokenizer_setting(manifest, repository, tokenizer_dir),
    }


def interface_gaps(
    interface: dict[str, dict[str, str]], inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]
) -> list[str]:
    """The tensors of ``interface`` (side -> name -> datatype) that the config does not declare as such."""
    declared = {
        "inputs": {t["name"]: t["datatype"] for t in inputs},
        "outputs": {t["name"]: t["datatype"] for t in outputs},
    }
    return [
        f"{side[:-1]} {tensor} {datatype}"
        for side, tensors in interface.items()
        for tensor, datatype in tensors.items()
        if declared[side].get(tensor) != datatype
    ]


def _check_interface(triton_name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> None:
    wrong = interface_gaps(GENERATION_INTERFACE, inputs, outputs)
    if wrong:
        raise ValidationFailed(
            f"Triton model {triton_name!r} lacks the generation interface ({', '.join(wrong)}); emit it again "
            "with `python -m build_engines emit SPEC`.",
            param="triton_name",
        )


def _tokenizer_setting(manifest: dict[str, Any], repository: Path, given: Path | None) -> str:
    """The catalogue's tokenizer_dir: the given directory, else the model's Hugging Face directory in this
    machine's copy of the model repository (the manifest's hf_model, relative to it). Stored relative to the
    project when it lies inside it (as the seed's tinylm), so that the entry holds on every checkout."""
    if given is not None:
        path = given
    else:
        hf_model = str(manifest.get("hf_model") or "")
        if not hf_model:
            raise ValidationFailed(
                "The manifest names no hf_model (written by an older build_engines): emit the model again, or "
                "pass --tokenizer-dir.",
                param="tokenizer_dir",
            )
        path = Path(hf_model) if Path(hf_model).is_absolute() else repository / hf_model
    path = path.resolve()
    if not (path / "tokenizer_config.json").is_file():
        raise ValidationFailed(
            f"No tokenizer at {path} (tokenizer_config.json): the control plane counts prompt tokens and applies "
            "the chat template with the model's own tokenizer, so it must be readable here; copy the model's "
            "Hugging Face directory (its tokenizer files are enough) and pass --tokenizer-dir.",
            param="tokenizer_dir",
        )
    base = Path(settings.BASE_DIR).resolve()
    return str(path.relative_to(base)) if path.is_relative_to(base) else str(path)
