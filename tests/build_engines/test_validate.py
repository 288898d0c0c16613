"""validate_model_repository / validate-configs against Triton's own ModelConfig schema."""

from __future__ import annotations

import pytest

from build_engines.cli import main
from build_engines.validate import validate_model_repository
from tests.build_engines.conftest import REPO_ROOT

GOOD = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 100 }}
"""


def _model(root, folder, text, version="1", files=("model.py",)):
    (root / folder).mkdir()
    (root / folder / "config.pbtxt").write_text(text)
    if version:
        (root / folder / version).mkdir()
        for name in files:
            (root / folder / version / name).write_text("")


def test_repository_triton_models_is_valid():
    models = REPO_ROOT / "triton_models"
    if not models.is_dir():
        pytest.skip("no triton_models/ yet")
    assert validate_model_repository(models) == []


def test_a_good_repository_has_no_errors(tmp_path):
    _model(tmp_path, "echo", GOOD.format(name="echo"))
    assert validate_model_repository(tmp_path) == []


@pytest.mark.parametrize(
    ("text", "version", "files", "expected"),
    [
        (GOOD.format(name="echo") + "\nbogus_field: 1\n", "1", ("model.py",), 'has no field named "bogus_field"'),
        (GOOD.format(name="echo").replace("TYPE_STRING", "TYPE_STRNG"), "1", ("model.py",), "TYPE_STRNG"),
        (GOOD.format(name="other"), "1", ("model.py",), "name 'other' does not match its folder 'echo'"),
        (GOOD.format(name="echo"), "", (), "no numeric version folder"),
        (GOOD.format(name="echo"), "v1", (), "no numeric version folder"),
        (GOOD.format(name="echo"), "1", (), "1/model.py is missing"),
        (GOOD.format(name="echo").replace('backend: "python"', ""), "1", ("model.py",), "neither backend nor platform"),
        (
            GOOD.format(name="echo").replace("max_batch_size: 4", "max_batch_size: 0"),
            "1",
            ("model.py",),
            "dynamic_batching needs max_batch_size > 0",
        ),
    ],
)
def test_broken_configs_are_reported(tmp_path, text, version, files, expected):
    _model(tmp_path, "echo", text, version, files)
    errors = validate_model_repository(tmp_path)
    assert len(errors) == 1 and errors[0].startswith("echo/config.pbtxt: ") and expected in errors[0], errors


def test_folder_without_config_and_missing_repository(tmp_path):
    (tmp_path / "lonely" / "1").mkdir(parents=True)
    assert validate_model_repository(tmp_path) == ["lonely: no config.pbtxt"]
    assert validate_model_repository(tmp_path / "absent") == [f"{tmp_path / 'absent'}: not a directory"]


def test_cli_validate_configs_exit_codes(tmp_path, capsys):
    _model(tmp_path, "good", GOOD.format(name="good"))
    assert main(["validate-configs", "--models-dir", str(tmp_path)]) == 0
    _model(tmp_path, "bad", GOOD.format(name="worse"))
    assert main(["validate-configs", "--models-dir", str(tmp_path)]) == 2
    assert "bad/config.pbtxt: name 'worse' does not match its folder 'bad'" in capsys.readouterr().err
