"""Triton model folders for generation specs: `<name>_vllm` (Triton's vLLM backend) or `<name>_trtllm`
(TensorRT-LLM's tensorrt_llm model, in-flight batching), plus the manifest the catalogue registers from.

Configs are built as Triton's ModelConfig protobuf (valid by construction), checked against the backends'
vendored key lists (backend_keys.py) before anything is written, and deterministic: re-emitting an unchanged
spec changes nothing in git. The manifest (build_engines/out/<name>/<triton name>/manifest.json) is not
committed: it carries timestamps and the estimate from the weights found on this machine.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from build_engines.backend_keys import trtllm_config_problems, vendored, vllm_config_problems
from build_engines.emit import write_config
from build_engines.errors import BuildEnginesError, CannotRunHere
from build_engines.generation_memory import (
    check_against_model,
    memory_per_gpu,
    read_hf_facts,
    serving_dtype,
)
from build_engines.generation_spec import VLLM_LORA_RANKS, GenerationSpec
from build_engines.manifest import MANIFEST, now, sha256_file, tool_versions

VERSION = "1"
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
ENGINE_SUBDIR = "engine"  # <name>_trtllm/1/engine: what trtllm-build writes, copied in by emit
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"  # the name generate_xgrammar_tokenizer_info.py writes
MULTI_LORA = "multi_lora.json"  # Triton's vLLM backend reads it beside model.json when enable_lora is on
# Architectures whose vLLM model class has no LoRA support (vllm/model_executor/models/gpt2.py: GPT2LMHeadModel
# is SupportsPP only): enable_lora would fail the load on the GPU host, so emit refuses adapters for them.
NO_VLLM_LORA = frozenset({"GPT2LMHeadModel"})


def emit_generation(
    spec: GenerationSpec, out_dir: Path, models_dir: Path, *, command: str, echo: Callable[[str], None] = print
) -> Path:
    hf_dir = spec.hf_dir(models_dir)
    facts = read_hf_facts(hf_dir)
    figures = check_against_model(spec, facts) if facts is not None else None
    if facts is None:
        echo(f"note: no config.json in {hf_dir}; configs written, model checks and the estimate skipped")
    folder = models_dir / spec.triton_name
    version_dir = folder / VERSION
    if spec.engine == "vllm":
        lora = lora_settings(spec, models_dir, check=facts is not None)
        config, extra = _vllm_config(spec), {"model.json": vllm_model_json(spec, facts, lora)}
        if lora is not None:
            extra[MULTI_LORA] = lora["multi_lora"]
    else:
        config, extra = _trtllm_config(spec), {}
    problems = _check(spec, config, extra)
    if problems:
        raise BuildEnginesError("emitted config fails the backend's vendored keys: " + "; ".join(problems))
    version_dir.mkdir(parents=True, exist_ok=True)
    write_config(folder, spec, config)
    for name, content in extra.items():
        (version_dir / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", "utf-8")
    if spec.engine == "tensorrt_llm":
        (version_dir / ".gitkeep").touch()  # the engine is built per GPU generation; the folder must exist
        built = out_dir / ENGINE_SUBDIR
        if built.is_dir():
            shutil.copytree(built, version_dir / ENGINE_SUBDIR, dirs_exist_ok=True)
        else:
            echo(f"note: no engine in {built}; {spec.triton_name} has its config only (build needs a GPU)")
    stale = version_dir / MULTI_LORA
    if MULTI_LORA not in extra and stale.exists():
        stale.unlink()  # adapters taken out of the spec: vLLM must not find the old list
    manifest = generation_manifest(spec, folder, out_dir, facts, figures, command=command)
    target = out_dir / spec.triton_name / MANIFEST
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
    echo(f"manifest {target}")
    return folder


def lora_settings(spec: GenerationSpec, models_dir: Path, *, check: bool) -> dict[str, Any] | None:
    """vLLM's LoRA settings for a spec with adapters: multi_lora.json (adapter name → its directory as Triton sees
    it, what the backend's `lora_name` looks up), max_loras and max_lora_rank (the spec's, else the largest r of
    the adapters found here, rounded up to a rank vLLM accepts). ``check``: each adapter found on this machine is
    checked against the base (build_engines/adapters.py: rank, target modules, the base's identity)."""
    if not spec.adapters:
        return None
    from build_engines.adapters import adapter_check

    hf_dir = spec.hf_dir(models_dir)
    architectures = json.loads((hf_dir / "config.json").read_text()).get("architectures") or [] if check else []
    unsupported = sorted(set(architectures) & NO_VLLM_LORA)
    if unsupported:
        raise BuildEnginesError(
            f"{spec.path}: generation.adapters: vLLM serves no LoRA adapters on {unsupported[0]} (it does not "
            "implement SupportsLoRA); serve them on the CPU engine (triton_models/tinylm) or use another base"
        )
    ranks = []
    for name, path in spec.adapters:
        local = spec.repository_path(path, models_dir)
        complete = (local / "adapter_model.safetensors").is_file() and any(hf_dir.glob("*.safetensors"))
        if check and complete:
            ranks.append(adapter_check(hf_dir, local, name=name).rank)
        elif (local / "adapter_config.json").is_file():
            ranks.append(int(json.loads((local / "adapter_config.json").read_text()).get("r", 0)))
    rank = spec.max_lora_rank
    if rank is None:
        if len(ranks) < len(spec.adapters):
            raise BuildEnginesError(
                f"{spec.path}: generation.max_lora_rank is needed: not every adapter's adapter_config.json is on "
                "this machine to read its rank from"
            )
        rank = next(r for r in VLLM_LORA_RANKS if r >= max(ranks))
    elif ranks and max(ranks) > rank:
        raise BuildEnginesError(f"{spec.path}: generation.max_lora_rank {rank} is below an adapter's r={max(ranks)}")
    return {
        "multi_lora": {name: spec.served_path(path) for name, path in spec.adapters},
        "max_loras": spec.max_loras or len(spec.adapters),
        "max_lora_rank": rank,
    }


def vllm_model_json(spec: GenerationSpec, facts: Any, lora: dict[str, Any] | None = None) -> dict[str, Any]:
    """vLLM's engine arguments: only keys accepted by every vendored vLLM snapshot (backend_keys).

    No guided-decoding key: vLLM enables it by default in both snapshots (v0.7: guided_decoding_backend
    "xgrammar"; v0.11: structured_outputs_config backend "auto") and the request selects it
    (sampling_parameters.guided_decoding). Naming the backend would need guided_decoding_backend, refused as
    deprecated in the newer snapshot, or structured_outputs_config, absent from the older one."""
    engine_args: dict[str, Any] = {
        "model": spec.served_hf_path(),
        "tensor_parallel_size": spec.tensor_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "max_num_seqs": spec.max_num_seqs,
        "max_model_len": spec.max_model_len,
        "enable_prefix_caching": spec.enable_prefix_caching,
        "dtype": spec.dtype,
    }
    if lora is not None:  # the backend then reads multi_lora.json beside model.json (lora_settings)
        engine_args |= {"enable_lora": True, "max_loras": lora["max_loras"], "max_lora_rank": lora["max_lora_rank"]}
    return engine_args


def _base(spec: GenerationSpec, backend: str, max_batch_size: int, doc: dict[str, Any], inputs: list[str]) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    config = pb.ModelConfig(name=spec.triton_name, backend=backend, max_batch_size=max_batch_size)
    # Decoupled: each request's answer streams back through its own sender, so a long generation never
    # holds back the lines around it, and the control plane commits each line as it finishes.
    config.model_transaction_policy.decoupled = True
    for name in inputs:
        data_type, dims, optional = doc["inputs"][name]
        config.input.add(name=name, data_type=pb.DataType.Value(data_type), dims=dims, optional=optional)
    for name, (data_type, dims) in doc["outputs"].items():
        config.output.add(name=name, data_type=pb.DataType.Value(data_type), dims=dims)
    return config


def _vllm_config(spec: GenerationSpec) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    doc = vendored("vllm_backend.json")
    inputs = [name for name in doc["inputs"] if name not in doc["reserved_inputs"]]
    config = _base(spec, "vllm", 0, doc, inputs)
    # KIND_MODEL: the engine takes the GPUs it sees (the backend refuses KIND_GPU above one GPU per instance).
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_MODEL)
    # The health check marks the model not ready when the engine died (explicit model control, as deployed).
    config.parameters["ENABLE_VLLM_HEALTH_CHECK"].string_value = "true"
    # Off: the backend turns vLLM's frontend multiprocessing off to report metrics (its own TODO), a
    # throughput cost the batch path does not pay for numbers the fleet does not read yet.
    config.parameters["REPORT_CUSTOM_METRICS"].string_value = "false"
    return config


def _trtllm_config(spec: GenerationSpec) -> Any:
    from tritonclient.grpc import model_config_pb2 as pb

    doc = vendored("tensorrtllm_backend.json")
    config = _base(spec, "tensorrtllm", spec.max_num_seqs, doc, list(doc["inputs"]))
    for tensor in config.input:  # as in TensorRT-LLM's template: scalars reshaped, token lists ragged
        if list(tensor.dims) == [1]:
            tensor.reshape.SetInParent()
        if tensor.name in ("input_ids", "stop_words_list"):
            tensor.allow_ragged_batch = True
    config.dynamic_batching.preferred_batch_size.append(spec.max_num_seqs)
    # KIND_CPU with the GPUs named by gpu_device_ids (orchestrator mode): the documented multi-GPU form.
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)
    engine_dir = f"{spec.served_repository}/{spec.triton_name}/{VERSION}/{ENGINE_SUBDIR}"
    parameters = {
        "gpt_model_type": "inflight_fused_batching",  # the documented batching_strategy
        "gpt_model_path": engine_dir,  # the documented engine_dir
        # A started request is never paused: the control plane's dispatch already reserves prompt + max_tokens
        # of KV per line, the same budget this policy guarantees.
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": f"{spec.kv_cache_free_gpu_mem_fraction}",
        "enable_kv_cache_reuse": "true" if spec.enable_prefix_caching else "false",
        "max_beam_width": "1",  # OpenAI's bodies have no beam search
        "exclude_input_in_output": "true",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "executor_worker_path": "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker",
        # Guided decoding (response_format json_object / json_schema): xgrammar is the one documented backend;
        # the C++ backend reads the tokenizer's vocabulary from the JSON that trtllm_build_commands writes
        # beside the engine (tensorrtllm_backend docs/guided_decoding.md, "C++ Backend").
        "guided_decoding_backend": "xgrammar",
        "xgrammar_tokenizer_info_path": f"{engine_dir}/{XGRAMMAR_TOKENIZER_INFO}",
    }
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return config


def _check(spec: GenerationSpec, config: Any, extra: dict[str, Any]) -> list[str]:
    if spec.engine == "vllm":
        problems = vllm_config_problems(config, [])
        from build_engines.backend_keys import model_json_problems

        return problems + model_json_problems(extra["model.json"])
    return trtllm_config_problems(config)


def trtllm_build_commands(spec: GenerationSpec, hf_dir: Path, out_dir: Path, facts: Any) -> list[list[str]]:
    """The documented steps (tensorrtllm_backend docs/llama_multi_instance.md): convert the Hugging Face
    checkpoint with the model family's convert_checkpoint.py (tensor parallelism is fixed here, --tp_size),
    then trtllm-build. Paged context FMHA is what KV-cache reuse runs on. Then (docs/guided_decoding.md) the
    tokenizer's xgrammar info, which guided decoding in the C++ backend reads."""
    dtype = serving_dtype(spec, facts)
    checkpoint = out_dir / "trtllm-checkpoint"
    convert = os.environ.get(
        "TRTLLM_CONVERT_CHECKPOINT", "<TensorRT-LLM>/examples/models/core/<family>/convert_checkpoint.py"
    )
    build = ["trtllm-build", "--checkpoint_dir", str(checkpoint), "--output_dir", str(out_dir / ENGINE_SUBDIR)]
    build += ["--remove_input_padding", "enable", "--gpt_attention_plugin", dtype, "--context_fmha", "enable"]
    build += ["--gemm_plugin", dtype, "--kv_cache_type", "paged", "--max_batch_size", str(spec.max_num_seqs)]
    build += ["--max_seq_len", str(spec.max_model_len)]
    if spec.enable_prefix_caching:
        build += ["--use_paged_context_fmha", "enable"]
    # Third, the tokenizer's vocabulary for xgrammar (guided decoding in the C++ backend), beside the engine.
    tokenizer_info = os.environ.get(
        "TRTLLM_XGRAMMAR_TOKENIZER_INFO", "<TensorRT-LLM>/examples/generate_xgrammar_tokenizer_info.py"
    )
    return [
        ["python3", convert, "--model_dir", str(hf_dir), "--output_dir", str(checkpoint), "--dtype", dtype,
         "--tp_size", str(spec.tensor_parallel_size)],
        build,
        ["python3", tokenizer_info, "--model_dir", str(hf_dir), "--output_dir", str(out_dir / ENGINE_SUBDIR)],
    ]  # fmt: skip


def build_reason(gpu: Any, have_trtllm_build: bool, have_convert: bool) -> str | None:
    missing = []
    if gpu is None:
        missing.append("no NVIDIA GPU was found (NVML, nvidia-smi and /dev/nvidia0 are all absent)")
    if not have_trtllm_build:
        missing.append("`trtllm-build` is not on PATH")
    if not have_convert:
        missing.append("TRTLLM_CONVERT_CHECKPOINT does not name the model family's convert_checkpoint.py")
    if not missing:
        return None
    return (
        f"Cannot build a TensorRT-LLM engine here because {', '.join(missing)}; emit still writes the config "
        "and the manifest records the build commands."
    )


def build_generation(
    spec: GenerationSpec, out_dir: Path, models_dir: Path, *, echo: Callable[[str], None] = print
) -> list[Path]:
    """vLLM: nothing to build (the backend serves the Hugging Face directory). TensorRT-LLM: the recorded
    commands, where a GPU and TensorRT-LLM's tools are; CannotRunHere (exit 4) elsewhere."""
    if spec.engine == "vllm":
        echo(f"nothing to build: the vLLM backend serves {spec.hf_model} as is")
        return []
    import subprocess

    from build_engines.gpu import detect_gpu

    convert = os.environ.get("TRTLLM_CONVERT_CHECKPOINT", "")
    reason = build_reason(
        detect_gpu(), shutil.which("trtllm-build") is not None, bool(convert) and Path(convert).is_file()
    )
    if reason:
        raise CannotRunHere(reason)
    hf_dir = spec.hf_dir(models_dir)
    for step in trtllm_build_commands(spec, hf_dir, out_dir, read_hf_facts(hf_dir)):  # pragma: no cover - GPU only
        echo("$ " + " ".join(step))
        subprocess.run(step, check=True)
    return [out_dir / ENGINE_SUBDIR]  # pragma: no cover


def generation_manifest(
    spec: GenerationSpec, folder: Path, out_dir: Path, facts: Any, figures: dict[str, int] | None, *, command: str
) -> dict[str, Any]:
    """What the catalogue needs to register the model, and how it was configured."""
    held, rule = memory_per_gpu(spec, facts)
    # Chat and responses need a chat template (the service applies it from the tokenizer); without one,
    # completions only.
    endpoints = [CHAT, COMPLETIONS, RESPONSES] if facts is not None and facts.has_chat_template else [COMPLETIONS]
    served = {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name in ("config.pbtxt", "model.json", MULTI_LORA)
    }
    stamp = now()
    manifest: dict[str, Any] = {
        "kind": "generation",
        "engine": spec.engine,
        "model": spec.name,
        "triton_name": spec.triton_name,
        "spec": {"path": str(spec.path), "sha256": spec.sha256},
        "endpoints": endpoints if facts is not None else None,
        "context_length": spec.max_model_len,
        "gpus_per_instance": spec.tensor_parallel_size,
        "pool": spec.pool,
        "memory_per_gpu_bytes": held,
        "memory_rule": rule,
        "gpu_memory_bytes_declared": int(spec.gpu_memory_gib * 1024**3),
        "max_num_seqs": spec.max_num_seqs,
        # vLLM's run_batch keeps 2 x max_num_seqs in flight so the engine never waits for the next request.
        "inflight_sequences_per_instance": 2 * spec.max_num_seqs,
        # Both engines decode under a JSON grammar (vLLM by default; TensorRT-LLM with the xgrammar parameters
        # emitted): the catalogue entry's structured_outputs, so response_format json lines are accepted.
        "structured_outputs": True,
        "dtype": serving_dtype(spec, facts),
        "hf_dir": spec.served_hf_path(),
        # As the spec names it: relative to the model repository on every machine (the control plane finds the
        # tokenizer in its own copy of the repository with it), or absolute.
        "hf_model": spec.hf_model,
        "tokenizer_dir": spec.served_hf_path(),  # the service tokenizes and applies the chat template from it
        "estimate": figures,
        # LoRA adapters (catalogue: one CatalogueAdapter per entry, named `<model>:<adapter>`).
        "adapters": [{"name": name, "path": spec.served_path(path)} for name, path in spec.adapters],
        "model_checks": "passed" if facts is not None else f"not run: no config.json in {spec.hf_dir(folder.parent)}",
        "served_files": served,
        "versions": tool_versions(),
        "created_at": stamp,
        "command": command,
    }
    if spec.engine == "tensorrt_llm":
        hf_dir = spec.hf_dir(folder.parent)
        manifest["build"] = {
            "commands": trtllm_build_commands(spec, hf_dir, out_dir, facts),
            "needs": "an NVIDIA GPU, TensorRT-LLM",
        }
    return manifest
