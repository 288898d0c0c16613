"""What a generation model holds on each GPU, from its Hugging Face config.json and weight files.

The figure the planner gets (`memory_per_gpu_bytes`) follows how each engine sizes itself:

* vLLM preallocates `gpu_memory_utilization` x the GPU's memory on each of its GPUs and fills whatever the
  weights and activations leave with KV-cache blocks. The instance holds that fraction however small the
  model is, so the declared figure is exactly util x GPU size; the weights + KV estimate below is a check.
* TensorRT-LLM loads the engine, then gives `kv_cache_free_gpu_mem_fraction` of the memory still free to the
  KV cache: weights + fraction x (GPU - weights) per GPU. Without the weights it is not known here.

The check refuses a spec whose budget cannot hold the weights plus one sequence of max_model_len tokens (the
engines refuse to start then). Activations and CUDA graphs (1-2 GiB on large models) are not in the estimate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from build_engines.errors import SpecError
from build_engines.generation_spec import GenerationSpec

GIB = 1024**3
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class HfFacts:
    """The few config.json facts the checks and the memory estimate need (Llama and GPT-2 key names)."""

    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    stored_dtype: str  # config.json's torch_dtype / dtype
    weights_bytes: int  # safetensors (or .bin) files as stored
    has_chat_template: bool  # tokenizer_config.json's chat_template, or transformers 5's chat_template.jinja


def read_hf_facts(hf_dir: Path) -> HfFacts | None:
    """None when there is no config.json (the model is not built or downloaded yet)."""
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text("utf-8"))

    def first(*keys: str, default: Any = None) -> Any:
        return next((config[k] for k in keys if config.get(k) is not None), default)

    heads = int(first("num_attention_heads", "n_head", default=0))
    hidden = int(first("hidden_size", "n_embd", default=0))
    weights = sorted(hf_dir.glob("*.safetensors")) or sorted(hf_dir.glob("*.bin"))
    tokenizer_config = hf_dir / "tokenizer_config.json"
    template = (hf_dir / "chat_template.jinja").is_file() or (
        tokenizer_config.is_file() and bool(json.loads(tokenizer_config.read_text("utf-8")).get("chat_template"))
    )
    return HfFacts(
        num_layers=int(first("num_hidden_layers", "n_layer", default=0)),
        num_attention_heads=heads,
        num_kv_heads=int(first("num_key_value_heads", default=heads)),
        head_dim=int(first("head_dim", default=hidden // heads if heads else 0)),
        context_length=int(first("max_position_embeddings", "n_positions", "n_ctx", default=0)),
        stored_dtype=str(first("torch_dtype", "dtype", default="float32")),
        weights_bytes=sum(p.stat().st_size for p in weights),
        has_chat_template=template,
    )


def serving_dtype(spec: GenerationSpec, facts: HfFacts | None) -> str:
    """vLLM's rule for "auto" (its --dtype help): FP16 for FP32 and FP16 models, BF16 for BF16 models."""
    if spec.dtype != "auto":
        return spec.dtype
    return "bfloat16" if facts is not None and facts.stored_dtype == "bfloat16" else "float16"


def estimate(spec: GenerationSpec, facts: HfFacts) -> dict[str, int]:
    """Per GPU of one instance: weights (split over tensor_parallel_size) and KV bytes per token."""
    serve_bytes = _DTYPE_BYTES[serving_dtype(spec, facts)]
    stored_bytes = _DTYPE_BYTES.get(facts.stored_dtype, 4)
    tp = spec.tensor_parallel_size
    weights = facts.weights_bytes * serve_bytes // stored_bytes // tp
    # K and V per layer per token; KV heads are split over the tensor-parallel ranks (replicated when fewer).
    kv_heads_per_gpu = max(1, -(-facts.num_kv_heads // tp))
    kv_per_token = 2 * facts.num_layers * kv_heads_per_gpu * facts.head_dim * serve_bytes
    return {"weights_bytes_per_gpu": weights, "kv_bytes_per_token_per_gpu": kv_per_token}


def memory_per_gpu(spec: GenerationSpec, facts: HfFacts | None) -> tuple[int, str]:
    """(bytes one instance holds on each of its GPUs, the rule that gave it)."""
    gpu = int(spec.gpu_memory_gib * GIB)
    if spec.engine == "vllm":
        assert spec.gpu_memory_utilization is not None
        return int(spec.gpu_memory_utilization * gpu), "vllm: gpu_memory_utilization x gpu_memory_gib (preallocated)"
    assert spec.kv_cache_free_gpu_mem_fraction is not None
    if facts is None:
        return gpu, "tensorrt_llm without config.json: the whole GPU (upper bound; weights unknown)"
    weights = estimate(spec, facts)["weights_bytes_per_gpu"]
    held = weights + int(spec.kv_cache_free_gpu_mem_fraction * (gpu - weights))
    return held, "tensorrt_llm: weights + kv_cache_free_gpu_mem_fraction x (gpu_memory_gib - weights)"


def check_against_model(spec: GenerationSpec, facts: HfFacts) -> dict[str, int]:
    """SpecError naming the field to change when the model cannot be served as the spec says; else the
    estimate with the KV tokens one GPU holds."""
    problems: list[tuple[str, str]] = []
    if facts.context_length and spec.max_model_len > facts.context_length:
        problems.append(
            (
                "generation.max_model_len",
                f"{spec.max_model_len} is above the model's context ({facts.context_length} positions in config.json)",
            )
        )
    tp = spec.tensor_parallel_size
    if facts.num_attention_heads % tp:
        problems.append(
            (
                "generation.tensor_parallel_size",
                f"{tp} does not divide the model's {facts.num_attention_heads} attention heads",
            )
        )
    figures = estimate(spec, facts)
    gpu = int(spec.gpu_memory_gib * GIB)
    weights, per_token = figures["weights_bytes_per_gpu"], figures["kv_bytes_per_token_per_gpu"]
    if spec.engine == "vllm":
        assert spec.gpu_memory_utilization is not None
        kv_room, field = int(spec.gpu_memory_utilization * gpu) - weights, "generation.gpu_memory_utilization"
    else:
        assert spec.kv_cache_free_gpu_mem_fraction is not None
        kv_room, field = (
            int(spec.kv_cache_free_gpu_mem_fraction * (gpu - weights)),
            "generation.kv_cache_free_gpu_mem_fraction",
        )
    one_sequence = per_token * spec.max_model_len
    if kv_room < one_sequence:
        problems.append(
            (
                field,
                f"leaves {max(kv_room, 0) / GIB:.2f} GiB per GPU for the KV cache after {weights / GIB:.2f} GiB of "
                f"weights, below one {spec.max_model_len}-token sequence ({one_sequence / GIB:.2f} GiB); raise it "
                "or tensor_parallel_size, or lower max_model_len",
            )
        )
    if problems:
        raise SpecError(spec.path, problems)
    return {**figures, "kv_tokens_per_gpu": kv_room // per_token if per_token else 0}
