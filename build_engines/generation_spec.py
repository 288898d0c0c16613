"""Specs for generation models: a Hugging Face causal-LM directory served as is by a GPU engine.

A generation spec has `name` and one `[generation]` table and nothing of a tensor spec (no source, inputs,
profile): vLLM loads the Hugging Face directory itself, and TensorRT-LLM builds its engine from it with its
own tools. Errors use the tensor specs' format, `<spec file>: generation.<field>: <what is wrong>`, all at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from build_engines.errors import SpecError

ENGINES = {"vllm": "vllm", "tensorrt_llm": "trtllm"}  # engine -> Triton folder suffix
DTYPES = ("auto", "float16", "bfloat16", "float32")
# Where deploy/ mounts the model repository inside the Triton containers (compose and k8s): model.json and
# engine_dir name paths as Triton sees them, not as the build machine does.
DEFAULT_SERVED_REPOSITORY = "/models"
# Fields that only one engine reads; giving one to the other engine is a spec error, not a silent no-op.
_ENGINE_ONLY = {"gpu_memory_utilization": "vllm", "kv_cache_free_gpu_mem_fraction": "tensorrt_llm"}
_FIELDS = {
    "hf_model",
    "engine",
    "tensor_parallel_size",
    "max_model_len",
    "max_num_seqs",
    "gpu_memory_utilization",
    "kv_cache_free_gpu_mem_fraction",
    "enable_prefix_caching",
    "dtype",
    "gpu_memory_gib",
    "pool",
    "served_repository",
    "adapters",
    "max_loras",
    "max_lora_rank",
}
# vLLM's LoRAConfig accepts only these max_lora_rank values; a spec's rank is rounded up to the next one.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class GenerationSpec:
    path: Path
    sha256: str
    name: str
    hf_model: str  # relative: inside the model repository (build: --models-dir, Triton: served_repository)
    engine: str
    tensor_parallel_size: int  # = the planner's gpus_per_instance: one instance spans this many GPUs
    max_model_len: int  # the context the service admits (prompt + max_tokens)
    max_num_seqs: int  # sequences decoding at once in one instance
    gpu_memory_utilization: float | None  # vLLM: fraction of each GPU the engine takes (weights + KV)
    kv_cache_free_gpu_mem_fraction: float | None  # TensorRT-LLM: fraction of what is free after the weights
    enable_prefix_caching: bool  # vLLM enable_prefix_caching / TensorRT-LLM enable_kv_cache_reuse
    dtype: str
    gpu_memory_gib: float  # declared memory of one GPU of the pool: the engines size their KV cache from it
    pool: str
    served_repository: str
    # LoRA adapters served on this base (vLLM: enable_lora + multi_lora.json): (name, PEFT directory inside the
    # model repository, or absolute), in the spec's order; tenants name them `<name of the model>:<adapter>`.
    adapters: tuple[tuple[str, str], ...] = ()
    max_loras: int | None = None  # adapters resident on the GPU at once (vLLM's default 1); None: all of them
    max_lora_rank: int | None = None  # None: the largest r of the adapters' adapter_config.json, at emit

    @property
    def triton_name(self) -> str:
        return f"{self.name}_{ENGINES[self.engine]}"

    def hf_dir(self, models_dir: Path) -> Path:
        """The Hugging Face directory on the machine running build_engines."""
        path = Path(self.hf_model)
        return path if path.is_absolute() else models_dir / path

    def repository_path(self, path: str, models_dir: Path) -> Path:
        """A path of the spec (an adapter's directory) on the machine running build_engines."""
        return Path(path) if Path(path).is_absolute() else models_dir / path

    def served_path(self, path: str) -> str:
        """A path of the spec as Triton sees it (the repository is mounted at served_repository)."""
        if PurePosixPath(path).is_absolute():
            return path
        return str(PurePosixPath(self.served_repository) / path)

    def served_hf_path(self) -> str:
        """The same directory as Triton sees it (the repository is mounted at served_repository)."""
        if PurePosixPath(self.hf_model).is_absolute():
            return self.hf_model
        return str(PurePosixPath(self.served_repository) / self.hf_model)


def parse_generation_spec(data: dict[str, Any], spec_path: Path, sha256: str) -> GenerationSpec:
    # The tensor parser's reader: the same typed getters and the same error wording.
    from build_engines.spec_parse import _Reader

    r = _Reader()
    r.no_extra(data, {"name", "generation"}, "")
    name = r.get(data, "name", "name", str)
    if name is not None and not (name.isascii() and name.replace("_", "").replace("-", "").isalnum()):
        r.fail("name", f"must be letters, digits, '_' or '-' (it names Triton model folders), got {name!r}")
    table = r.table(data, "generation", "generation")
    r.no_extra(table, _FIELDS, "generation.")

    def field(key: str, kind: type | tuple[type, ...], default: Any = _Reader._MISSING) -> Any:
        return r.get(table, key, f"generation.{key}", kind, default=default)

    hf_model = field("hf_model", str)
    if hf_model is not None and (not hf_model.strip() or ".." in PurePosixPath(hf_model).parts):
        r.fail("generation.hf_model", f"must be a directory inside the model repository or absolute, got {hf_model!r}")
    engine = field("engine", str)
    if engine is not None and engine not in ENGINES:
        r.fail("generation.engine", f"must be one of {', '.join(ENGINES)}, got {engine!r}")
    tp = field("tensor_parallel_size", int, default=1)
    if tp is not None and tp < 1:
        r.fail("generation.tensor_parallel_size", f"must be at least 1, got {tp}")
    max_model_len = field("max_model_len", int)
    if max_model_len is not None and max_model_len < 2:
        r.fail(
            "generation.max_model_len", f"must be at least 2 (a prompt token and one generated), got {max_model_len}"
        )
    max_num_seqs = field("max_num_seqs", int, default=64)
    if max_num_seqs is not None and max_num_seqs < 1:
        r.fail("generation.max_num_seqs", f"must be at least 1, got {max_num_seqs}")
    fractions: dict[str, float | None] = {}
    for key, owner in _ENGINE_ONLY.items():
        value = field(key, float, default=None)
        if value is not None and engine is not None and engine != owner:
            r.fail(f"generation.{key}", f'applies to engine = "{owner}" only, this spec has engine = "{engine}"')
        elif value is not None and not 0.0 < value <= 1.0:
            r.fail(f"generation.{key}", f"must be within (0, 1], got {value}")
        # The engines' own defaults (vLLM 0.90, TensorRT-LLM 0.9), written out so the manifest's memory
        # figure never depends on a default nobody sees.
        fractions[key] = value if value is not None or engine != owner else 0.9
    prefix = field("enable_prefix_caching", bool, default=True)
    dtype = field("dtype", str, default="auto")
    if dtype is not None and dtype not in DTYPES:
        r.fail("generation.dtype", f"must be one of {', '.join(DTYPES)}, got {dtype!r}")
    gpu_gib = field("gpu_memory_gib", float)
    if gpu_gib is not None and gpu_gib <= 0:
        r.fail("generation.gpu_memory_gib", f"must be > 0 (the pool's GPU size in GiB), got {gpu_gib}")
    pool = field("pool", str, default="default")
    adapters = _adapters(r, r.table(table, "adapters", "generation.adapters", required=False))
    max_loras = field("max_loras", int, default=None)
    if max_loras is not None and max_loras < 1:
        r.fail("generation.max_loras", f"must be at least 1, got {max_loras}")
    max_lora_rank = field("max_lora_rank", int, default=None)
    if max_lora_rank is not None and max_lora_rank not in VLLM_LORA_RANKS:
        r.fail("generation.max_lora_rank", f"must be one of vLLM's {list(VLLM_LORA_RANKS)}, got {max_lora_rank}")
    if (max_loras is not None or max_lora_rank is not None) and not adapters:
        r.fail("generation.adapters", "max_loras / max_lora_rank need adapters to serve")
    if adapters and engine == "tensorrt_llm":
        r.fail("generation.adapters", 'LoRA adapters are emitted for engine = "vllm" only')
    served = field("served_repository", str, default=DEFAULT_SERVED_REPOSITORY)
    if served is not None and not PurePosixPath(served).is_absolute():
        r.fail("generation.served_repository", f"must be an absolute path inside the Triton container, got {served!r}")
    if r.problems:
        raise SpecError(spec_path, r.problems)
    return GenerationSpec(
        path=spec_path,
        sha256=sha256,
        name=name,
        hf_model=hf_model,
        engine=engine,
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=fractions["gpu_memory_utilization"],
        kv_cache_free_gpu_mem_fraction=fractions["kv_cache_free_gpu_mem_fraction"],
        enable_prefix_caching=prefix,
        dtype=dtype,
        gpu_memory_gib=gpu_gib,
        pool=pool,
        served_repository=served,
        adapters=adapters,
        max_loras=max_loras,
        max_lora_rank=max_lora_rank,
    )


def _adapters(r: Any, table: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """`[generation.adapters]`: adapter name = its PEFT directory (as hf_model: inside the repository, or absolute)."""
    import re

    adapters = []
    for name, path in table.items():
        field = f"generation.adapters.{name}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,62}", name):
            r.fail(field, "an adapter's name is lower-case letters, digits, '-' and '_' (tenants write model:name)")
        elif not isinstance(path, str) or not path.strip() or ".." in PurePosixPath(path).parts:
            r.fail(field, f"must be the adapter's directory inside the model repository or absolute, got {path!r}")
        else:
            adapters.append((name, path))
    return tuple(adapters)
