"""The tuner reads a served shape from a config.pbtxt and writes one back, changing the tuned fields only
(build_engines/tune_config.py), and its command refuses what it cannot tune with an `error:` line."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from build_engines.cli import main
from build_engines.errors import SpecError
from build_engines.tune_config import ConfigRewriteError, parse, rewrite, shape_of
from build_engines.tune_search import Shape
from tests.build_engines.conftest import REPO_ROOT

MODELS = REPO_ROOT / "triton_models"


def _text(model: str) -> str:
    return (MODELS / model / "config.pbtxt").read_text()


def test_the_served_shapes_are_read_from_the_shipped_configs():
    assert shape_of(parse(_text("minilm"))) == Shape(64, None, (), 2, 1)
    assert shape_of(parse(_text("minilm_ort"))) == Shape(64, 2000, (16, 32, 64), 1, None)


@pytest.mark.parametrize("model", ["minilm", "minilm_ort", "identity", "sleep_per_row"])
@pytest.mark.parametrize(
    "shape", [Shape(32, 500, (16, 32), 3, 2), Shape(8, None, (), 1, 1), Shape(128, 0, (128,), 2, 1)]
)
def test_a_rewritten_config_reads_as_the_shape_and_keeps_every_comment(model: str, shape: Shape):
    original = _text(model)
    if shape_of(parse(original)).threads is None:
        shape = Shape(shape.max_batch_size, shape.delay_us, shape.preferred, shape.instances, None)
    written = rewrite(original, shape)
    assert shape_of(parse(written)) == shape
    comments = [line for line in original.splitlines() if line.strip().startswith("#")]
    if shape.delay_us is not None:  # removing dynamic_batching may take a comment inside it along
        assert comments == [line for line in written.splitlines() if line.strip().startswith("#")]
    # Everything else Triton reads is as it was.
    before, after = parse(original), parse(written)
    for message in (before, after):
        for name in ("max_batch_size", "dynamic_batching", "instance_group"):
            message.ClearField(name)
        if "INTRA_OP_THREADS" in message.parameters:
            del message.parameters["INTRA_OP_THREADS"]
    assert before == after


def test_only_the_tuned_lines_change():
    original = _text("minilm")
    written = rewrite(original, Shape(32, None, (), 1, 2))
    changed = [(a, b) for a, b in zip(original.splitlines(), written.splitlines(), strict=True) if a != b]
    assert changed == [
        ("max_batch_size: 64", "max_batch_size: 32"),
        ("    count: 2", "    count: 1"),
        ('    value: { string_value: "1" }', '    value: { string_value: "2" }'),
    ]


def test_an_unchanged_shape_is_the_same_text():
    original = _text("minilm")
    assert rewrite(original, shape_of(parse(original))) == original


def test_a_shape_the_text_cannot_hold_is_refused():
    # minilm has INTRA_OP_THREADS; a config without the parameter cannot be given threads.
    with pytest.raises(ConfigRewriteError, match="INTRA_OP_THREADS"):
        rewrite(_text("identity"), Shape(8, 500, (), 1, 2))


def test_a_broken_config_is_a_spec_error():
    with pytest.raises(SpecError, match=r"config\.pbtxt"):
        parse("max_batch_size: [")


def _error(argv: list[str]) -> tuple[int, str]:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, stderr.getvalue()


def test_the_command_refuses_a_generation_engine_without_its_shape_parameters(tmp_path: Path):
    # vLLM's backend sizes its batch in model.json, not in MAX_NUM_SEQS / KV_BUDGET_TOKENS parameters.
    code, stderr = _error(["tune", "tinylm_vllm", "--out", str(tmp_path)])
    assert code == 2
    assert stderr.startswith("error: ") and "MAX_NUM_SEQS" in stderr and "Traceback" not in stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--budget-s", "0"], "--budget-s: must be > 0"), (["--concurrency", "-1"], "--concurrency: must be > 0")],
)
def test_the_command_refuses_bad_flags(flags: list[str], message: str):
    code, stderr = _error(["tune", "identity", *flags])
    assert code == 2
    assert message in stderr


def test_an_unknown_target_is_named_in_the_error():
    code, stderr = _error(["tune", "no_such_model"])
    assert code == 2
    assert "no_such_model" in stderr


def test_the_load_defaults_are_the_control_planes():
    """The tuner runs without Django, so it repeats the scheduler's default: held equal here."""
    from django.conf import settings

    from build_engines.tune import DEFAULT_CONCURRENCY
    from controlplane.core.env import VARIABLES

    assert settings.SCHEDULER_CALLS_PER_INSTANCE  # the settings are loaded, so the registry is filled
    assert VARIABLES["SCHEDULER_CALLS_PER_INSTANCE"].default == DEFAULT_CONCURRENCY


def test_targets_take_their_specs_corpus_and_a_plans_batch_limit():
    from build_engines.tune import resolve_target

    minilm = resolve_target("minilm", MODELS)
    assert minilm.model_dir == MODELS / "minilm" and minilm.texts and minilm.batch_limit is None
    # A TensorRT plan serves at most its profile's batch: larger candidates are not tried.
    assert resolve_target("minilm_trt", MODELS).batch_limit == 64
    identity = resolve_target(str(MODELS / "identity"), MODELS / "elsewhere")
    assert (identity.name, identity.texts, identity.inputs_from) == ("identity", None, "synthetic rows")


def test_a_corpus_file_replaces_the_specs_and_an_empty_one_is_refused(tmp_path: Path):
    from build_engines.tune import resolve_target, with_corpus

    texts = tmp_path / "texts.txt"
    texts.write_text("a longer text than the other\n\nshort\n")
    minilm = with_corpus(resolve_target("minilm", MODELS), texts)
    assert minilm.texts == ["a longer text than the other", "short"] and str(texts) in minilm.inputs_from
    (tmp_path / "empty.txt").write_text("\n\n")
    code, stderr = _error(["tune", "minilm", "--corpus", str(tmp_path / "empty.txt")])
    assert code == 2 and "--corpus" in stderr and "holds no text" in stderr
    code, stderr = _error(["tune", "minilm", "--corpus", str(tmp_path / "missing.txt")])
    assert code == 2 and "cannot be read" in stderr
