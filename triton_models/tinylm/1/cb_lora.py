"""LoRA adapters for the continuous-batching engine (cb_engine.py): many adapters on one base, chosen per sequence.

An adapter is a PEFT LoRA directory (adapter_config.json + adapter_model.safetensors: per target layer a pair
A [r, in], B [out, r], scaled by lora_alpha / r). The base's weights are never changed: each target layer's
forward is wrapped once, and adds, for the rows of the pass that carry an adapter with a pair for that layer,
x @ A.T @ B.T x scale, grouped by adapter (punica's and S-LoRA's shape: one small matrix product per adapter
present in the step, not per sequence; a loop over the adapters present, which on CPU costs what the rows do).
Rows of the base (no adapter) and adapters without a pair for a layer pass through it unchanged.

Loading and unloading happen between steps, on the engine thread's terms: `load` reads and checks the files
in the caller's thread, the engine swaps the registry at its next step. An unloaded adapter takes no new
request at once; sequences that already run with it keep its weights (they hold the object) until they end.
Each load has its own `key` (name and a load counter), which salts the prefix cache's block keys: a prefix
computed with one adapter (or an earlier load under the same name) is never served to another.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<part>[AB])(?:\.default)?\.weight$")
_loads = itertools.count(1)


@dataclass(eq=False)
class Adapter:
    name: str
    rank: int
    scale: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]]  # module path → (A.T [in, r], B.T [r, out]) x scale
    path: str = ""
    key: str = field(default="")  # name#load: the prefix cache's salt

    def __post_init__(self) -> None:
        if not self.key:
            self.key = f"{self.name}#{next(_loads)}"


def read_adapter(name: str, path: str | Path, model: Any) -> Adapter:
    """The adapter at `path`, checked against `model` (every pair names one of its layers, at its widths);
    ValueError naming what does not fit."""
    from safetensors.torch import load_file

    path = Path(path)
    config_path = path / "adapter_config.json"
    if not config_path.is_file() or not (path / "adapter_model.safetensors").is_file():
        raise ValueError(f"LoRA adapter {name!r}: {path} has no adapter_config.json + adapter_model.safetensors")
    config = json.loads(config_path.read_text())
    if config.get("peft_type") != "LORA":
        raise ValueError(f"LoRA adapter {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    rank = int(config["r"])
    scale = float(config.get("lora_alpha", rank)) / rank
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(path / "adapter_model.safetensors")).items():
        match = _KEY.match(key)
        if match is None:
            raise ValueError(f"LoRA adapter {name!r}: tensor {key!r} is not a LoRA pair's weight")
        parts.setdefault(match["module"], {})[match["part"]] = tensor
    weights = {}
    parameter = next(model.parameters())
    for module_path, pair in parts.items():
        try:
            module = model.get_submodule(module_path)
        except AttributeError:
            raise ValueError(f"LoRA adapter {name!r}: the base has no layer {module_path!r}") from None
        a, b = pair.get("A"), pair.get("B")
        fan_in, fan_out = _widths(module)
        if a is None or b is None or tuple(a.shape) != (rank, fan_in) or tuple(b.shape) != (fan_out, rank):
            raise ValueError(f"LoRA adapter {name!r}: {module_path} does not fit the base's layer at r={rank}")
        # Kept transposed and with the scale folded in: the forward's two products need nothing else.
        weights[module_path] = (
            a.T.contiguous().to(device=parameter.device, dtype=parameter.dtype),
            (b.T * scale).contiguous().to(device=parameter.device, dtype=parameter.dtype),
        )
    if not weights:
        raise ValueError(f"LoRA adapter {name!r}: no LoRA weights in {path}")
    return Adapter(name, rank, scale, weights, str(path))


def _widths(module: Any) -> tuple[int, int]:
    weight = module.weight
    if type(module).__name__ == "Conv1D":  # GPT-2 stores [in, out]
        return int(weight.shape[0]), int(weight.shape[1])
    return int(weight.shape[1]), int(weight.shape[0])


class LoraRegistry:
    """The loaded adapters by name, the wrapped layers, and which adapter each row of the current pass runs."""

    def __init__(self, model: Any, adapters_dir: str | Path | None = None, max_loras: int = 0) -> None:
        self.model = model
        self._device = next(model.parameters()).device  # row indices live where the activations do
        self.adapters_dir = Path(adapters_dir) if adapters_dir else None
        self.max_loras = max_loras  # 0: no limit
        self._by_name: dict[str, Adapter] = {}
        self._uses = itertools.count()
        self._last_used: dict[str, int] = {}  # name → when a request last named it (LRU eviction at max_loras)
        self._wrapped: set[str] = set()
        self._lock = threading.Lock()
        # Set by the engine thread around a forward pass: (adapter, row indices) per adapter present.
        self._groups: list[tuple[Adapter, torch.Tensor | None]] = []

    # ---- names (any thread) -------------------------------------------------------------------------------
    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._by_name)

    def available(self) -> list[str]:
        """Adapters in the adapters directory (loaded or not)."""
        if self.adapters_dir is None or not self.adapters_dir.is_dir():
            return []
        return sorted(p.name for p in self.adapters_dir.iterdir() if (p / "adapter_config.json").is_file())

    def get(self, name: str) -> Adapter:
        """The adapter named `name`, loaded now from the adapters directory if it is there and not yet loaded;
        ValueError when there is no such adapter."""
        with self._lock:
            adapter = self._by_name.get(name)
            if adapter is not None:
                self._last_used[name] = next(self._uses)
        if adapter is not None:
            return adapter
        if self._in_directory(name):
            return self.load(name)
        known = ", ".join(sorted({*self.names(), *self.available()})) or "none"
        raise ValueError(f"unknown LoRA adapter {name!r} (adapters: {known})")

    def _in_directory(self, name: str) -> bool:
        # A plain folder name only: a request's lora_name never reaches outside the adapters directory.
        plain = re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", name) is not None
        return plain and self.adapters_dir is not None and (self.adapters_dir / name / "adapter_config.json").is_file()

    def load(self, name: str, path: str | Path | None = None) -> Adapter:
        """Read and register an adapter (replacing one of that name for new requests). At `max_loras` the least
        recently used adapter is unloaded for it: safe at any time, its running sequences keep their weights, and
        a later request naming it loads it again from the adapters directory."""
        if path is None:
            if self.adapters_dir is None:
                raise ValueError("no adapters directory: give the adapter's path")
            path = self.adapters_dir / name
        adapter = read_adapter(name, path, self.model)
        with self._lock:
            while self.max_loras and name not in self._by_name and len(self._by_name) >= self.max_loras:
                oldest = min(self._by_name, key=lambda loaded: self._last_used.get(loaded, -1))
                del self._by_name[oldest]
            for module_path in adapter.weights:
                if module_path not in self._wrapped:
                    self._wrap(module_path)
                    self._wrapped.add(module_path)
            self._by_name[name] = adapter
            self._last_used[name] = next(self._uses)
        return adapter

    def unload(self, name: str) -> None:
        """Stop serving `name` to new requests; running sequences keep it until they end. ValueError when it is
        not loaded."""
        with self._lock:
            if self._by_name.pop(name, None) is None:
                loaded = ", ".join(self._by_name) or "none"
                raise ValueError(f"LoRA adapter {name!r} is not loaded (loaded: {loaded})")

    # ---- the forward (engine thread) ------------------------------------------------------------------------
    @contextmanager
    def rows(self, adapters: Sequence[Adapter | None]) -> Iterator[None]:
        """Run a forward pass whose row i uses `adapters[i]` (None: the base)."""
        present: dict[int, tuple[Adapter, list[int]]] = {}
        for row, adapter in enumerate(adapters):
            if adapter is not None:
                present.setdefault(id(adapter), (adapter, []))[1].append(row)
        self._groups = [
            (adapter, None if len(rows) == len(adapters) else torch.tensor(rows, dtype=torch.long, device=self._device))
            for adapter, rows in present.values()
        ]
        try:
            yield
        finally:
            self._groups = []

    def _wrap(self, module_path: str) -> None:
        module = self.model.get_submodule(module_path)
        original: Callable[[Any], Any] = module.forward
        registry = self

        def forward(x: torch.Tensor) -> torch.Tensor:
            out = original(x)
            for adapter, index in registry._groups:
                pair = adapter.weights.get(module_path)
                if pair is None:
                    continue
                a_t, b_t = pair
                if index is None:  # every row of the pass runs this adapter
                    out = out + (x @ a_t) @ b_t
                else:
                    delta = (x.index_select(0, index) @ a_t) @ b_t
                    out = out.index_add(0, index, delta)
            return out

        module.forward = forward
