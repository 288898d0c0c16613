"""MiniLM embeddings computed in this process, without Triton: parity tests and the benchmark ceiling.

The maths lives in `triton_models/minilm/1/minilm_core.py`, next to the Triton model that uses it.
Model code must not import the control plane, so the dependency points this way: we load that file by
path. Triton and this class therefore run the very same tokenisation, pooling and normalisation.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

MINILM_CORE_PATH = Path(__file__).resolve().parents[2] / "triton_models" / "minilm" / "1" / "minilm_core.py"
# The exported graph the served model runs on ONNX Runtime when present (`make install` writes it).
MINILM_ONNX_PATH = MINILM_CORE_PATH.with_name("model.onnx")
_MODULE_NAME = "_triton_models_minilm_core"


def load_minilm_core() -> ModuleType:
    """Import minilm_core.py once per process (it pulls in torch and transformers: slow)."""
    module = sys.modules.get(_MODULE_NAME)
    if module is None:
        spec = importlib.util.spec_from_file_location(_MODULE_NAME, MINILM_CORE_PATH)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {MINILM_CORE_PATH}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_MODULE_NAME] = module
        spec.loader.exec_module(module)
    return module


def served_runtime() -> str:
    """The runtime triton_models/minilm serves with its RUNTIME "auto": ONNX Runtime when the export exists."""
    return "onnxruntime" if MINILM_ONNX_PATH.exists() else "torch"


class InProcessMiniLM:
    """all-MiniLM-L6-v2 in this process. ``runtime`` "torch" (the default: the reference the parity tests
    compare with) or "onnxruntime" (the exported graph); ``threads`` sets the runtime's intra-op threads
    (torch: process-wide; None: the runtime's default)."""

    def __init__(self, threads: int | None = None, runtime: str = "torch") -> None:
        onnx_file = MINILM_ONNX_PATH if runtime == "onnxruntime" else None
        self._encoder = load_minilm_core().MiniLMEncoder(threads=threads, onnx_file=onnx_file)
        self.runtime = self._encoder.runtime

    def embed(
        self, texts: list[str], batch_size: int = 64, sort_by_length: bool = True, max_padding: float | None = None
    ) -> tuple[np.ndarray, list[int]]:
        """(n, 384) float32 unit-norm embeddings and token counts, in input order.

        Texts are truncated to 256 tokens; the counts include [CLS]/[SEP] as Triton's TOKENS does. ``max_padding``
        (sorted only): a batch also ends before its padded tokens would pass that multiple of its real ones.
        """
        embeddings, tokens = self._encoder.embed(
            texts, batch_size=batch_size, sort_by_length=sort_by_length, max_padding=max_padding
        )
        return embeddings, tokens
