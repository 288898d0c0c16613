"""The spec loader: the shipped spec loads, and every error names the field to fix."""

from __future__ import annotations

import pytest

from build_engines.errors import SpecError
from build_engines.spec import load_spec
from tests.build_engines.conftest import SMALL_MINILM, write_spec


def test_shipped_minilm_spec_loads_by_name():
    spec = load_spec("minilm")
    assert spec.name == "minilm"
    assert [t.name for t in spec.inputs] == ["input_ids", "attention_mask"]
    assert spec.outputs[0].shape == ("batch", 384)
    assert spec.profile["max"] == {"batch": 64, "sequence": 256}
    assert spec.triton.max_batch_size == 64
    assert spec.text is not None and spec.text.corpus.is_file()
    assert len(spec.sha256) == 64


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('name = "minilm"', 'name = "mini lm"', "name"),
        ('source = "build_engines.sources.minilm:build_model"', 'source = "nocolon"', "source"),
        ("opset = 17", "opset = 3", "opset"),
        ('precisions = ["fp32", "fp16"]', 'precisions = ["fp32", "int8"]', "precisions[1]"),
        ('dtype = "int64"\nshape', 'dtype = "float"\nshape', "inputs[0].dtype"),
        ('shape = ["batch", 384]', 'shape = ["batch", 0]', "outputs[0].shape[1]"),
        ("low = 0\nhigh = 30522", "low = 0", "inputs[0].high"),
        ("max_batch_size = 8", 'max_batch_size = "eight"', "triton.max_batch_size"),
        ("max_batch_size = 8", "max_batch_size = 16", "profile.max.batch"),
        (
            "preferred_batch_size = [4, 8]",
            "preferred_batch_size = [4, 12]",
            "triton.dynamic_batching.preferred_batch_size[1]",
        ),
        ("opt = { batch = 4, sequence = 16 }", "opt = { batch = 4, sequence = 64 }", "profile.opt.sequence"),
        ("min = { batch = 1, sequence = 1 }", "min = { batch = 1 }", "profile.min.sequence"),
        ("min = { batch = 1, sequence = 1 }", "min = { batch = 1, sequence = 1, tokens = 2 }", "profile.min.tokens"),
        ("[tolerance.fp16]\nmax_abs = 5e-3\nmin_cosine = 0.999", "", "tolerance.fp16"),
        ("min_cosine = 0.99999", "min_cosine = 2.0", "tolerance.fp32.min_cosine"),
        ('trt_precision = "fp16"', 'trt_precision = "int8"', "triton.trt_precision"),
        ('compute_capabilities = ["8.0", "9.0"]', 'compute_capabilities = ["sm90"]', "triton.compute_capabilities[0]"),
        ("max_length = 32", "max_length = 64", "text.max_length"),
        ("corpus = ", 'corpus = "missing.txt"\n# ', "text.corpus"),
        ("[triton]\n", "[triton]\nmax_batch = 3\n", "triton.max_batch"),
        ("opset = 17", "opset = 17\ntolerence = 1", "tolerence"),
        ('shape = ["batch", 384]', 'shape = [384, "batch"]', "outputs[0].shape[0]"),
    ],
)
def test_spec_errors_name_the_field(tmp_path, old, new, field):
    assert old in SMALL_MINILM
    path = write_spec(tmp_path, SMALL_MINILM.replace(old, new, 1))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert field in caught.value.fields, str(caught.value)
    assert f": {field}: " in str(caught.value)
    assert caught.value.exit_code == 2


def test_all_problems_are_reported_at_once(tmp_path):
    text = SMALL_MINILM.replace("opset = 17", "opset = 3").replace('dtype = "fp32"', 'dtype = "f32"')
    with pytest.raises(SpecError) as caught:
        load_spec(write_spec(tmp_path, text))
    assert {"opset", "outputs[0].dtype"} <= set(caught.value.fields)


def test_invalid_toml_and_missing_file_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="<toml>"):
        load_spec(write_spec(tmp_path, "name = "))
    with pytest.raises(SpecError, match="no spec file"):
        load_spec(tmp_path / "nope.toml")


def test_shape_outside_profile_names_the_profile_field(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    with pytest.raises(SpecError) as caught:
        spec.check_axis_sizes({"batch": 9, "sequence": 16})
    message = str(caught.value)
    assert caught.value.fields == ["profile.max.batch"]
    assert "batch=9 is above the profile maximum 8; raise profile.max.batch" in message
    spec.check_axis_sizes({"batch": 8, "sequence": 32})  # the edges themselves are inside
