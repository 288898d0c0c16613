"""vLLM emission of a generation spec with LoRA adapters: model.json enables LoRA (max_loras, max_lora_rank
rounded up to a rank vLLM accepts), multi_lora.json maps each adapter name to its directory as Triton sees it
(what the backend's `lora_name` looks up), the manifest lists them; wrong adapter fields fail the spec, and a
base vLLM has no LoRA for is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from build_engines.backend_keys import vllm_engine_args
from build_engines.emit_generation import emit_generation
from build_engines.errors import BuildEnginesError, SpecError
from build_engines.spec import load_any_spec
from tests.build_engines.conftest import write_spec
from tests.build_engines.test_generation_emit import GOOD, emit

ADAPTERS = """
[generation.adapters]
pirate = "lm/1/adapters/pirate"
legal = "/weights/loras/legal"
"""


def adapter_config(directory: Path, rank: int) -> None:
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 16}))


def test_adapters_enable_lora_and_write_multi_lora(tmp_path):
    adapter_config(tmp_path / "triton_models" / "lm" / "1" / "adapters" / "pirate", 12)
    text = GOOD + "max_lora_rank = 16\n" + ADAPTERS
    _, folder, manifest = emit(tmp_path, text, kv_heads=2)
    model_json = json.loads((folder / "1" / "model.json").read_text())
    assert (model_json["enable_lora"], model_json["max_loras"], model_json["max_lora_rank"]) == (True, 2, 16)
    assert set(model_json) <= vllm_engine_args()
    assert json.loads((folder / "1" / "multi_lora.json").read_text()) == {
        "pirate": "/models/lm/1/adapters/pirate",
        "legal": "/weights/loras/legal",
    }
    assert manifest["adapters"] == [
        {"name": "pirate", "path": "/models/lm/1/adapters/pirate"},
        {"name": "legal", "path": "/weights/loras/legal"},
    ]
    assert set(manifest["served_files"]) == {"config.pbtxt", "1/model.json", "1/multi_lora.json"}


def test_the_rank_comes_from_the_adapters_found_rounded_up_to_vllms(tmp_path):
    adapter_config(tmp_path / "triton_models" / "lm" / "1" / "adapters" / "pirate", 12)
    _, folder, _ = emit(tmp_path, GOOD + 'max_loras = 1\n[generation.adapters]\npirate = "lm/1/adapters/pirate"\n')
    model_json = json.loads((folder / "1" / "model.json").read_text())
    assert (model_json["max_loras"], model_json["max_lora_rank"]) == (1, 16)
    # An adapter whose config is not on this machine: the spec must say the rank.
    with pytest.raises(BuildEnginesError, match="max_lora_rank is needed"):
        emit(tmp_path / "b", GOOD + ADAPTERS)
    # A rank below an adapter's r would fail every request of that adapter on the GPU host.
    adapter_config(tmp_path / "c" / "triton_models" / "lm" / "1" / "adapters" / "pirate", 32)
    with pytest.raises(BuildEnginesError, match="max_lora_rank 16 is below an adapter's r=32"):
        emit(tmp_path / "c", GOOD + "max_lora_rank = 16\n" + ADAPTERS)


def test_taking_the_adapters_out_removes_multi_lora(tmp_path):
    _, folder, _ = emit(tmp_path, GOOD + "max_lora_rank = 8\n" + ADAPTERS)
    assert (folder / "1" / "multi_lora.json").is_file()
    plain = load_any_spec(write_spec(tmp_path, GOOD, "plain.toml"))
    emit_generation(plain, tmp_path / "out", folder.parent, command="test", echo=lambda _: None)
    assert not (folder / "1" / "multi_lora.json").exists()
    assert "enable_lora" not in json.loads((folder / "1" / "model.json").read_text())


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ('[generation.adapters]\n"Bad:Name" = "lm/1/adapters/x"\n', "generation.adapters.Bad:Name"),
        ('[generation.adapters]\nx = "../outside"\n', "generation.adapters.x"),
        ("max_lora_rank = 12\n" + ADAPTERS, "generation.max_lora_rank"),
        ("max_loras = 0\n" + ADAPTERS, "generation.max_loras"),
        ("max_loras = 2\n", "generation.adapters"),
    ],
)
def test_wrong_adapter_fields_fail_the_spec(tmp_path, extra, field):
    with pytest.raises(SpecError) as caught:
        load_any_spec(write_spec(tmp_path, GOOD + extra))
    assert field in caught.value.fields


def test_a_base_vllm_has_no_lora_for_is_refused(tmp_path):
    # tinylm is a GPT-2: vLLM's GPT2LMHeadModel does not implement SupportsLoRA.
    version = Path(__file__).resolve().parents[2] / "triton_models" / "tinylm" / "1"
    models = tmp_path / "triton_models"
    shutil.copytree(version / "hf", models / "lm" / "1" / "hf")
    text = GOOD.replace("tensor_parallel_size = 2", "tensor_parallel_size = 1") + "max_lora_rank = 8\n" + ADAPTERS
    spec = load_any_spec(write_spec(tmp_path, text))
    with pytest.raises(BuildEnginesError, match="vLLM serves no LoRA adapters on GPT2LMHeadModel"):
        emit_generation(spec, tmp_path / "out", models, command="test", echo=lambda _: None)


@pytest.mark.django_db
def test_registering_the_manifest_enters_its_adapters_in_the_catalogue(tmp_path):
    from controlplane.fleet.models import CatalogueAdapter
    from tests.build_engines.test_generation_catalogue import register

    spec, folder, _ = emit(tmp_path, GOOD + "max_lora_rank = 8\n" + ADAPTERS, kv_heads=2)
    register(tmp_path, spec, folder)
    rows = CatalogueAdapter.objects.filter(base__name="lm").order_by("name")
    assert [(a.full_name, a.path, a.is_enabled) for a in rows] == [
        ("lm:legal", "/weights/loras/legal", True),
        ("lm:pirate", "/models/lm/1/adapters/pirate", True),
    ]
    # Emitted again without one: its row stays (the ledger names it) but serves no more lines.
    spec = load_any_spec(
        write_spec(tmp_path, GOOD + "max_lora_rank = 8\n" + ADAPTERS.replace('legal = "/weights/loras/legal"\n', ""))
    )
    emit_generation(spec, tmp_path / "out", folder.parent, command="test", echo=lambda _: None)
    register(tmp_path, spec, folder)
    assert dict(CatalogueAdapter.objects.filter(base__name="lm").values_list("name", "is_enabled")) == {
        "legal": False,
        "pirate": True,
    }
