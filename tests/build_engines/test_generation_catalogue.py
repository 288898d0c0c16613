"""A generation manifest against the catalogue: `catalogue_register` enters a vLLM model as a generation entry
(context, sequences, gang profile, tokenizer) after checking that the served files are the emitted ones, that
the config speaks the generation kind's interface and that the tokenizer is readable here; a TensorRT-LLM model,
which takes token ids, is refused with the reason. The last test registers the shipped vLLM specs with
the real tokenizers and parses a chat line against the entry."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from build_engines.emit_generation import emit_generation
from build_engines.spec import load_any_spec
from controlplane.fleet.catalogue.generation import GENERATION_LOAD_SECONDS, generation_profile
from tests.build_engines.test_generation_emit import TRT, emit

pytestmark = pytest.mark.django_db


def register(tmp_path: Path, spec, folder: Path, *extra: str, name: str = "lm") -> str:
    from io import StringIO

    out = StringIO()
    call_command(
        "catalogue_register",
        str(tmp_path / "out" / spec.triton_name / "manifest.json"),
        "--name",
        name,
        "--triton-name",
        spec.triton_name,
        "--model-repository",
        str(folder.parent),
        *extra,
        stdout=out,
    )
    return out.getvalue()


def test_a_tensor_parallel_manifest_maps_to_a_gang_profile_with_its_kv_budget(tmp_path):
    _, _, manifest = emit(tmp_path, TRT)
    profile = generation_profile(manifest)
    assert profile["gpus_per_instance"] == 2 and profile["pool"] == "llm"
    # Per GPU, KV budget included: weights + 0.5 x (80 GiB - weights), well above the weights alone.
    assert profile["memory_per_instance_bytes"] == manifest["memory_per_gpu_bytes"]
    assert profile["memory_per_instance_bytes"] > 40 * 1024**3 > manifest["estimate"]["weights_bytes_per_gpu"]


def test_a_vllm_manifest_registers_a_generation_entry_with_its_gang_profile(tmp_path):
    from controlplane.fleet.models import CatalogueModel, ModelKind

    spec, folder, manifest = emit(tmp_path)
    printed = register(tmp_path, spec, folder)
    model = CatalogueModel.objects.get(name="lm")
    assert (model.triton_name, model.kind, model.max_batch_size) == ("lm_vllm", ModelKind.GENERATION, 1)
    assert (model.context_length, model.max_num_seqs, model.structured_outputs) == (128, 8, True)
    assert (model.gpus_per_instance, model.pool) == (2, "llm")
    assert model.memory_per_instance_bytes == manifest["memory_per_gpu_bytes"]
    assert model.load_seconds == GENERATION_LOAD_SECONDS
    assert Path(model.tokenizer_dir) == (folder.parent / "lm" / "1" / "hf").resolve()
    assert {t["name"] for t in model.inputs} >= {"text_input", "sampling_parameters", "stream"}
    assert {t["name"]: t["datatype"] for t in model.outputs}["text_output"] == "BYTES"
    assert "generation, 128-token context, 2 GPU(s) per instance in pool 'llm'" in printed


def test_registering_again_refreshes_the_interface_and_keeps_the_measured_profile(tmp_path):
    from controlplane.fleet.models import CatalogueModel

    spec, folder, _ = emit(tmp_path)
    register(tmp_path, spec, folder)
    CatalogueModel.objects.filter(name="lm").update(load_seconds=42.0, context_length=1, is_enabled=False)
    register(tmp_path, spec, folder)
    model = CatalogueModel.objects.get(name="lm")
    assert (model.load_seconds, model.context_length, model.is_enabled) == (42.0, 128, False)


def test_a_trtllm_manifest_is_refused_because_its_model_takes_token_ids(tmp_path):
    from controlplane.fleet.models import CatalogueModel

    spec, folder, _ = emit(tmp_path, TRT)
    with pytest.raises(CommandError) as caught:
        register(tmp_path, spec, folder)
    assert "takes token ids" in str(caught.value) and 'engine = "vllm"' in str(caught.value)
    assert not CatalogueModel.objects.filter(name="lm").exists()


def test_a_served_config_that_changed_after_the_emit_is_refused(tmp_path):
    from controlplane.fleet.models import CatalogueModel

    spec, folder, _ = emit(tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + "\n# edited by hand\n")
    with pytest.raises(CommandError) as caught:
        register(tmp_path, spec, folder)
    assert "config.pbtxt has sha256" in str(caught.value) and "build_engines emit" in str(caught.value)
    assert not CatalogueModel.objects.filter(name="lm").exists()


def test_a_config_without_the_generation_interface_is_refused(tmp_path):
    import hashlib
    import json

    spec, folder, _ = emit(tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "text_input"', 'name: "prompt"'))
    manifest_path = tmp_path / "out" / spec.triton_name / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["served_files"]["config.pbtxt"] = hashlib.sha256(config.read_bytes()).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CommandError, match=r"lacks the generation interface .*input text_input BYTES"):
        register(tmp_path, spec, folder)


def test_a_tokenizer_not_readable_here_is_refused_and_can_be_named(tmp_path):
    from controlplane.fleet.models import CatalogueModel

    spec, folder, _ = emit(tmp_path)
    elsewhere = tmp_path / "tokenizer"
    shutil.move(folder.parent / "lm" / "1" / "hf", elsewhere)
    with pytest.raises(CommandError, match=r"No tokenizer at .*pass --tokenizer-dir"):
        register(tmp_path, spec, folder)
    assert not CatalogueModel.objects.filter(name="lm").exists()
    register(tmp_path, spec, folder, "--tokenizer-dir", str(elsewhere))
    assert Path(CatalogueModel.objects.get(name="lm").tokenizer_dir) == elsewhere.resolve()


@pytest.mark.parametrize(
    ("spec_name", "folder_name", "context"), [("tinylm_vllm", "tinylm", 256), ("smollm2_vllm", "smollm2", 2048)]
)
def test_a_shipped_vllm_spec_registers_and_its_entry_parses_a_chat_line(tmp_path, spec_name, folder_name, context):
    """The real counterpart: a shipped spec emitted beside the model `make install` builds (tinylm trained,
    SmolLM2 converted from its GGUF), registered, and a chat body parsed against the entry with the real
    tokenizer and chat template."""
    from controlplane.fleet.models import CatalogueModel
    from controlplane.kinds.registry import kind_for

    built = Path(settings.BASE_DIR) / "triton_models" / folder_name / "1" / "hf"
    assert (built / "tokenizer_config.json").is_file(), "make install builds the model"
    models = tmp_path / "triton_models"
    (models / folder_name / "1").mkdir(parents=True)
    (models / folder_name / "1" / "hf").symlink_to(built)
    spec = load_any_spec(spec_name)
    folder = emit_generation(spec, tmp_path / "out", models, command="test", echo=lambda _: None)
    register(tmp_path, spec, folder, name="lm-gpu")
    model = CatalogueModel.objects.get(name="lm-gpu")
    # Inside the project: stored relative, as the seed's entries, so the entry holds on every checkout.
    assert model.tokenizer_dir == f"triton_models/{folder_name}/1/hf"
    assert (model.context_length, model.max_num_seqs, model.gpus_per_instance) == (context, 64, 1)
    body = {"model": "lm-gpu", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}
    line = kind_for("/v1/chat/completions").parse_body(body, model=model)
    assert line.request.prompt_tokens > 2 and line.units >= line.request.prompt_tokens
