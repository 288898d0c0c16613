"""LoRA adapters for a generation base model: check a PEFT directory against its base and copy it into the model
repository, where the engine (triton_models/tinylm/1/cb_lora.py) loads it at start.

    python -m build_engines adapter add BASE_MODEL_DIR PEFT_DIR --name NAME [--models-dir DIR]

What is checked, each failure an AdapterError naming the file and field to fix:
- the format: `adapter_config.json` with `peft_type` "LORA", a positive integer `r` and `lora_alpha`,
  `target_modules`, no `modules_to_save`, no trained bias; `adapter_model.safetensors` (or PEFT's older
  `adapter_model.bin` is refused: pickles are not loaded);
- the base's identity: every LoRA pair names a linear layer the base has (`base_model.model.<module path>`),
  `lora_A` is r x the layer's input width and `lora_B` its output width x r; where the adapter's
  `adapter_manifest.json` records the base's fingerprint (tinylm's trainer writes one), it must be the base's;
- the rank: at most MAX_RANK (vLLM's max_lora_rank choices end at 512; the engine's own limit is memory).

The copy lands at `<base version folder>/adapters/<name>/` (the base directory's sibling `adapters/`), which the
engine scans when it starts; a running engine loads it by name without a restart (docs/architecture/generation.md,
"Adapters (LoRA)").
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from build_engines.errors import BuildEnginesError

MAX_RANK = 512
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])(?:\.default)?\.weight$")


class AdapterError(BuildEnginesError):
    exit_code = 2


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    modules: int  # LoRA pairs in the weights
    path: Path


def base_fingerprint(base_dir: Path) -> str:
    """sha256 of the base's weights file(s), in name order: which base an adapter was trained on."""
    digest = hashlib.sha256()
    files = sorted(Path(base_dir).glob("*.safetensors"))
    if not files:
        raise AdapterError(f"{base_dir}: no *.safetensors weights: not a Hugging Face model directory")
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as stream:
            for chunk in iter(lambda: stream.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _config(peft_dir: Path) -> dict[str, Any]:
    path = peft_dir / "adapter_config.json"
    if not path.is_file():
        raise AdapterError(f"{peft_dir}: no adapter_config.json (not a PEFT adapter directory)")
    try:
        config = json.loads(path.read_text())
    except ValueError as exc:
        raise AdapterError(f"{path}: not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: must be a JSON object")
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{path}: peft_type is {config.get('peft_type')!r}; only LORA adapters are served")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 < rank <= MAX_RANK:
        raise AdapterError(f"{path}: r must be an integer in 1..{MAX_RANK}, got {rank!r}")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or alpha <= 0:
        raise AdapterError(f"{path}: lora_alpha must be a positive number, got {alpha!r}")
    if config.get("modules_to_save"):
        raise AdapterError(
            f"{path}: modules_to_save {config['modules_to_save']!r}: adapters that replace whole "
            "modules are not served (only LoRA pairs)"
        )
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias {config['bias']!r}: adapters with trained biases are not served")
    if config.get("use_dora") or config.get("rank_pattern") or config.get("alpha_pattern"):
        raise AdapterError(f"{path}: DoRA and per-module rank_pattern/alpha_pattern are not served")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise AdapterError(f"{path}: target_modules must name the base's modules, got {targets!r}")
    return config


def _base_linear_shapes(base_dir: Path) -> dict[str, tuple[int, int]]:
    """(input width, output width) of every 2-D weight of the base, by module path (`transformer.h.0.attn.c_attn`).

    Read from the safetensors header only: a Linear stores [out, in]; GPT-2's Conv1D [in, out] (its config's
    model_type says which)."""
    config = json.loads((base_dir / "config.json").read_text())
    conv1d = config.get("model_type") == "gpt2"
    shapes: dict[str, tuple[int, int]] = {}
    for path in sorted(base_dir.glob("*.safetensors")):
        with path.open("rb") as stream:
            size = int.from_bytes(stream.read(8), "little")
            header = json.loads(stream.read(size))
        for key, entry in header.items():
            if key == "__metadata__" or not key.endswith(".weight") or len(entry.get("shape", ())) != 2:
                continue
            rows, columns = entry["shape"]
            module = key.removesuffix(".weight")
            shapes[module] = (rows, columns) if conv1d else (columns, rows)
    return shapes


def _lookup(shapes: dict[str, tuple[int, int]], module: str) -> tuple[int, int] | None:
    """The base's layer for an adapter's module path; PEFT's path is the model class's (`model.layers.0...`
    for Llama, `transformer.h.0...` for GPT-2), the weights file may carry the same with or without a prefix."""
    if module in shapes:
        return shapes[module]
    for prefix in ("model.", "transformer."):
        if f"{prefix}{module}" in shapes:
            return shapes[f"{prefix}{module}"]
        if module.startswith(prefix) and module.removeprefix(prefix) in shapes:
            return shapes[module.removeprefix(prefix)]
    return None


def adapter_check(base_dir: Path, peft_dir: Path, *, name: str) -> AdapterInfo:
    """The adapter's facts when `peft_dir` is a LoRA adapter servable on `base_dir`; else AdapterError."""
    from safetensors import safe_open

    if not NAME_PATTERN.match(name):
        raise AdapterError(
            f"--name {name!r}: lower-case letters, digits, '-' and '_' (at most 63), as tenants "
            "write it after the base's name (`base:name`)"
        )
    base_dir, peft_dir = Path(base_dir), Path(peft_dir)
    if not (base_dir / "config.json").is_file():
        raise AdapterError(f"{base_dir}: no config.json (not a Hugging Face model directory)")
    config = _config(peft_dir)
    rank = int(config["r"])
    weights = peft_dir / "adapter_model.safetensors"
    if not weights.is_file():
        raise AdapterError(
            f"{peft_dir}: no adapter_model.safetensors (an adapter_model.bin pickle is not loaded; "
            "save it with safe_serialization=True)"
        )
    manifest = peft_dir / "adapter_manifest.json"
    if manifest.is_file():
        recorded = json.loads(manifest.read_text()).get("base_fingerprint")
        if recorded and recorded != base_fingerprint(base_dir):
            raise AdapterError(
                f"{manifest}: trained on another base (fingerprint {recorded[:12]}…, "
                f"{base_dir} is {base_fingerprint(base_dir)[:12]}…)"
            )
    shapes = _base_linear_shapes(base_dir)
    targets = tuple(config["target_modules"])
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    with safe_open(str(weights), framework="pt") as stream:
        for key in stream.keys():  # noqa: SIM118 - safe_open is not a mapping
            match = _KEY.match(key)
            if match is None:
                raise AdapterError(
                    f"{weights}: tensor {key!r} is not a LoRA pair's weight "
                    "(base_model.model.<module>.lora_A/lora_B.weight)"
                )
            pairs.setdefault(match["module"], {})[match["part"]] = tuple(stream.get_slice(key).get_shape())
    if not pairs:
        raise AdapterError(f"{weights}: no LoRA weights")
    for module, parts in sorted(pairs.items()):
        if set(parts) != {"A", "B"}:
            raise AdapterError(f"{weights}: module {module!r} has lora_{''.join(parts)} without its pair")
        if module.rsplit(".", 1)[-1] not in targets:
            raise AdapterError(f"{weights}: module {module!r} is not in target_modules {list(targets)}")
        shape = _lookup(shapes, module)
        if shape is None:
            raise AdapterError(f"{weights}: the base {base_dir} has no linear layer {module!r} (another base?)")
        fan_in, fan_out = shape
        if parts["A"] != (rank, fan_in) or parts["B"] != (fan_out, rank):
            raise AdapterError(
                f"{weights}: {module}: lora_A {list(parts['A'])} and lora_B {list(parts['B'])} do not fit the "
                f"base's layer ({fan_in} in, {fan_out} out) at r={rank}: trained on another base?"
            )
    return AdapterInfo(name, rank, float(config.get("lora_alpha", rank)), targets, len(pairs), peft_dir)


def adapter_add(base_dir: Path, peft_dir: Path, *, name: str, adapters_dir: Path | None = None) -> AdapterInfo:
    """Check, then copy the adapter to `adapters_dir/name` (default: `adapters/` beside the base directory)."""
    info = adapter_check(base_dir, peft_dir, name=name)
    target_root = adapters_dir or Path(base_dir).resolve().parent / "adapters"
    target = target_root / name
    partial = target_root / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for file in ("adapter_config.json", "adapter_model.safetensors", "adapter_manifest.json"):
        if (Path(peft_dir) / file).is_file():
            shutil.copy2(Path(peft_dir) / file, partial / file)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)  # whole or absent: the engine never scans a half-copied adapter
    return AdapterInfo(info.name, info.rank, info.alpha, info.target_modules, info.modules, target)
