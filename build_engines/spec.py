"""Typed, validated model specs (TOML, read with the standard library's tomllib).

A spec is the single source of truth for one model: how to build it in torch, which tensors it takes and
returns, the optimisation profile TensorRT compiles for, the parity tolerances, and what Triton gets.
Validation collects every problem at once and names each by its dotted field path, because an ML engineer
fixing a spec wants the whole list, not one error per run.
"""

from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from build_engines.errors import SpecError

if TYPE_CHECKING:
    from build_engines.generation_spec import GenerationSpec

SPECS_DIR = Path(__file__).resolve().parent / "specs"
PRECISIONS = ("fp32", "fp16")
DTYPES = ("int32", "int64", "fp16", "fp32")
VALUE_KINDS = ("uniform", "ones", "mask")
PROFILE_LEVELS = ("min", "opt", "max")
DEFAULT_OPSET = 17

Dim = int | str  # an int is a fixed size; a str names a dynamic axis sized by the profile


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...]
    values: str  # how verify draws random inputs: uniform in [low, high), all ones, or right-padded masks
    low: float
    high: float


@dataclass(frozen=True)
class OutputSpec:
    name: str
    dtype: str
    shape: tuple[Dim, ...]


@dataclass(frozen=True)
class Tolerance:
    max_abs: float
    min_cosine: float
    max_rel: float | None  # row-norm relative error; optional because max_abs and cosine usually suffice


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_size: tuple[int, ...]
    max_queue_delay_microseconds: int


@dataclass(frozen=True)
class TritonSpec:
    max_batch_size: int
    instance_count: int
    trt_precision: str
    compute_capabilities: tuple[str, ...]
    dynamic_batching: DynamicBatching | None


@dataclass(frozen=True)
class TextSpec:
    tokenizer: str  # "module:function" returning a Hugging Face tokenizer, used by verify
    model_dir: str  # "module:function" returning the weights dir; the emitted model.py calls it itself
    max_length: int
    corpus: Path


@dataclass(frozen=True)
class ModelSpec:
    path: Path
    sha256: str
    name: str
    source: str
    opset: int
    precisions: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    profile: dict[str, dict[str, int]]  # level -> axis name -> size
    tolerance: dict[str, Tolerance]
    triton: TritonSpec
    text: TextSpec | None
    workspace_mib: int

    def shape_at(self, tensor: InputSpec, level: str) -> tuple[int, ...]:
        return self.concrete_shape(tensor.shape, self.profile[level])

    @staticmethod
    def concrete_shape(shape: tuple[Dim, ...], sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(dim if isinstance(dim, int) else sizes[dim] for dim in shape)

    def check_axis_sizes(self, sizes: dict[str, int]) -> None:
        """Reject axis sizes outside the optimisation profile, naming the profile field to widen."""
        problems = []
        for axis, size in sizes.items():
            if axis not in self.profile["max"]:
                known = ", ".join(sorted(self.profile["max"]))
                problems.append((f"profile.*.{axis}", f"no dynamic axis named {axis!r} (axes: {known})"))
            elif size > self.profile["max"][axis]:
                problems.append(
                    (
                        f"profile.max.{axis}",
                        f"shape {axis}={size} is above the profile maximum "
                        f"{self.profile['max'][axis]}; raise profile.max.{axis} or use a smaller shape",
                    )
                )
            elif size < self.profile["min"][axis]:
                problems.append(
                    (
                        f"profile.min.{axis}",
                        f"shape {axis}={size} is below the profile minimum "
                        f"{self.profile['min'][axis]}; lower profile.min.{axis} or use a larger shape",
                    )
                )
        if problems:
            raise SpecError(self.path, problems)


def resolve_spec_path(arg: str) -> Path:
    """Accept a path or a bare model name ("minilm" -> build_engines/specs/minilm.toml)."""
    candidate = Path(arg)
    if candidate.is_file():
        return candidate.resolve()
    named = SPECS_DIR / f"{arg}.toml"
    if named.is_file():
        return named
    raise SpecError(arg, [("<file>", f"no spec file at {candidate} or {named}")])


def _read_spec(path: str | Path) -> tuple[Path, dict[str, Any], str]:
    spec_path = resolve_spec_path(str(path))
    raw_bytes = spec_path.read_bytes()
    try:
        data = tomllib.loads(raw_bytes.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(spec_path, [("<toml>", f"not valid TOML: {exc}")]) from exc
    return spec_path, data, hashlib.sha256(raw_bytes).hexdigest()


def load_spec(path: str | Path) -> ModelSpec:
    """A tensor model's spec (torch -> ONNX -> TensorRT)."""
    # Imported here: the parser builds these dataclasses, so a module-level import would be circular.
    from build_engines.spec_parse import parse_spec

    spec_path, data, sha = _read_spec(path)
    if "generation" in data:
        raise SpecError(
            spec_path,
            [
                (
                    "generation",
                    "this is a generation spec: export, verify and the TensorRT plan build are for tensor "
                    "models; a generation model is served from its Hugging Face directory (emit, build)",
                )
            ],
        )
    return parse_spec(data, spec_path, sha)


def load_any_spec(path: str | Path) -> ModelSpec | GenerationSpec:
    """A tensor spec, or a generation spec when the file has a [generation] table."""
    from build_engines.generation_spec import parse_generation_spec

    spec_path, data, sha = _read_spec(path)
    if "generation" in data:
        return parse_generation_spec(data, spec_path, sha)
    return load_spec(spec_path)
