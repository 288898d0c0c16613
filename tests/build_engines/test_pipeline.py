"""export -> verify -> emit on MiniLM at a small profile, plus the failures each step must report."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import pytest

from build_engines.cli import main
from build_engines.manifest import sha256_file
from tests.build_engines.conftest import REPO_ROOT, SMALL_MINILM, write_spec


def test_all_exports_verifies_and_emits(built):
    assert built.exit_code == 0, built.stdout
    onnx_file = built.out / "onnx" / "model.onnx"
    model = onnx.load(str(onnx_file), load_external_data=False)
    assert [i.name for i in model.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in model.graph.output] == ["EMBEDDING"]
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]
    assert "PASS" in built.stdout
    assert "corpus lines 1-8" in built.stdout  # the real sentences ran, in batches of profile.max.batch


def test_manifest_records_provenance_and_parity(built):
    manifest = json.loads((built.out / "onnx" / "manifest.json").read_text())
    assert manifest["sha256"] == sha256_file(built.out / "onnx" / "model.onnx")
    assert manifest["spec"]["sha256"] and manifest["opset"] == 17
    assert manifest["versions"]["torch"] and manifest["versions"]["onnxruntime"]
    assert "tensorrt" in manifest["versions"]
    assert manifest["shapes"]["inputs"]["input_ids"]["max"] == [8, 32]
    assert manifest["command"].startswith("python -m build_engines all")
    parity = manifest["parity"]
    assert parity["passed"] and parity["seed"] == 7
    assert parity["max_abs"] < 1e-4 and parity["min_cosine"] > 0.99999
    assert {c["case"] for c in parity["cases"]} >= {"random min", "random opt", "random max"}


def test_verify_fails_with_exit_3_above_tolerance(built, tmp_path, capsys):
    strict = write_spec(tmp_path, SMALL_MINILM.replace("max_abs = 1e-4", "max_abs = 1e-12"))
    code = main(["verify", str(strict), "--out", str(built.out), "--seed", "3"])
    assert code == 3
    err = capsys.readouterr().err
    assert "verify failed" in err and "tolerance.fp32.max_abs" in err


def test_verify_rejects_a_shape_outside_the_profile(built, capsys):
    code = main(["verify", str(built.spec), "--out", str(built.out), "--shape", "batch=9"])
    assert code == 2
    assert "profile.max.batch: shape batch=9 is above the profile maximum 8" in capsys.readouterr().err


def test_verify_before_export_says_to_export(tmp_path, capsys):
    code = main(["verify", str(write_spec(tmp_path)), "--out", str(tmp_path / "empty")])
    assert code == 1
    assert "run `python -m build_engines export" in capsys.readouterr().err


def test_spec_input_the_model_does_not_take_names_the_field(tmp_path, capsys):
    extra = '\n[[inputs]]\nname = "token_type_ids"\ndtype = "int64"\nshape = ["batch", "sequence"]\nvalues = "ones"\n'
    text = SMALL_MINILM.replace("[[outputs]]", extra + "\n[[outputs]]", 1)
    code = main(["export", str(write_spec(tmp_path, text)), "--out", str(tmp_path / "out")])
    assert code == 2
    assert "inputs[2].name: build_engines.sources.minilm:build_model's forward() has no argument" in (
        capsys.readouterr().err
    )


TOY_SPEC = """
name = "toy"
source = "tests.build_engines.sources_for_tests:{factory}"
[[inputs]]
name = "x"
dtype = "fp32"
shape = ["batch", 4]
[[outputs]]
name = "y"
dtype = "fp32"
shape = ["batch", 4]
[profile]
min = {{ batch = 1 }}
opt = {{ batch = 2 }}
max = {{ batch = 2 }}
[tolerance.fp32]
max_abs = 1e-5
min_cosine = 0.9999
[triton]
max_batch_size = 2
"""


def test_unsupported_operator_names_opset_and_source(tmp_path, capsys):
    spec = write_spec(tmp_path, TOY_SPEC.format(factory="build_unsupported"))
    assert main(["export", str(spec), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert ": opset: torch.onnx.export cannot express an operator at opset 17" in err
    assert "aten::cummax" in err and not (tmp_path / "out" / "onnx" / "model.onnx").exists()


def test_source_that_is_not_a_module_names_source(tmp_path, capsys):
    spec = write_spec(tmp_path, TOY_SPEC.format(factory="build_not_a_module"))
    assert main(["export", str(spec), "--out", str(tmp_path / "out")]) == 2
    assert ": source: " in capsys.readouterr().err


def test_cli_process_exit_codes(tmp_path):
    broken = write_spec(tmp_path, SMALL_MINILM.replace("opset = 17", "opset = 3"))
    done = subprocess.run(
        [sys.executable, "-m", "build_engines", "export", str(broken)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("error: ") and "opset: must be between 9 and 21" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", ["export", "build"])
def test_help_lists_the_options(command, capsys):
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"])
    assert exited.value.code == 0
    assert "--out" in capsys.readouterr().out
