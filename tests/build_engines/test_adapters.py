"""`python -m build_engines adapter check|add`: a PEFT LoRA directory is checked against its base (format, rank,
target modules, the base's identity) before it is copied where the engine loads it. On tinylm's trained
adapters (`make install`), and copies of them broken one field at a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from build_engines.cli import main

VERSION_DIR = Path(__file__).resolve().parents[2] / "triton_models" / "tinylm" / "1"
BASE = VERSION_DIR / "hf"
ADAPTER = VERSION_DIR / "adapters" / "reverse"


@pytest.fixture
def peft(tmp_path: Path) -> Path:
    if not (ADAPTER / "adapter_model.safetensors").exists():
        pytest.fail(f"{ADAPTER} is missing: `make install` trains it (build_engines/sources/tinylm_adapters.py)")
    copy = tmp_path / "peft"
    shutil.copytree(ADAPTER, copy)
    return copy


def edit_config(peft: Path, **fields) -> None:
    path = peft / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_add_checks_and_copies_the_adapter_whole(peft, tmp_path, capsys):
    target = tmp_path / "adapters"
    args = ["adapter", "add", str(BASE), str(peft), "--name", "backwards", "--adapters-dir", str(target)]
    assert main(args) == 0
    assert "added backwards: r=8 alpha=16 8 LoRA layers (c_attn, c_proj, c_fc)" in capsys.readouterr().out
    assert sorted(p.name for p in (target / "backwards").iterdir()) == [
        "adapter_config.json",
        "adapter_manifest.json",
        "adapter_model.safetensors",
    ]
    assert [p.name for p in target.iterdir()] == ["backwards"]  # no partial copy left beside it


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"peft_type": "PREFIX_TUNING"}, "only LORA adapters are served"),
        ({"r": 4}, "do not fit the base's layer"),
        ({"r": 0}, "r must be an integer in 1..512"),
        ({"target_modules": ["q_proj"]}, "is not in target_modules ['q_proj']"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "all"}, "trained biases"),
    ],
)
def test_a_wrong_config_is_refused_naming_the_field(peft, capsys, edit, message):
    edit_config(peft, **edit)
    assert main(["adapter", "check", str(BASE), str(peft), "--name", "x"]) == 2
    assert message in capsys.readouterr().err


def test_an_adapter_of_another_base_is_refused(peft, tmp_path, capsys):
    # Same shapes, other weights: only the recorded fingerprint tells the bases apart.
    other = tmp_path / "other-base"
    shutil.copytree(BASE, other)
    weights = other / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b" ")  # any change to the weights file
    assert main(["adapter", "check", str(other), str(peft), "--name", "x"]) == 2
    assert "trained on another base" in capsys.readouterr().err
    # Without the manifest, the layers still have to exist at the adapter's widths.
    (peft / "adapter_manifest.json").unlink()
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))  # reads widths as [out, in]
    assert main(["adapter", "check", str(other), str(peft), "--name", "x"]) == 2
    assert "do not fit the base's layer" in capsys.readouterr().err


def test_bad_names_and_missing_files_are_refused(peft, capsys):
    assert main(["adapter", "check", str(BASE), str(peft), "--name", "Has:Colon"]) == 2
    assert "lower-case letters" in capsys.readouterr().err
    (peft / "adapter_model.safetensors").unlink()
    assert main(["adapter", "check", str(BASE), str(peft), "--name", "x"]) == 2
    assert "no adapter_model.safetensors" in capsys.readouterr().err
