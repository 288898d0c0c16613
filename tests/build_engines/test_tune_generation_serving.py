"""`python -m build_engines tune` on a real tritonserver over tinylm, a decoupled generation engine.

A tiny budget: the baseline measured twice and a candidate or two. What must hold whatever this host's speed:
the baseline serves completion tokens, and the config left behind is the baseline or one measured faster."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from build_engines.cli import main
from build_engines.emit import DEFAULT_MODELS_DIR
from build_engines.tune_config import parse
from build_engines.tune_generation import generation_shape_of
from build_engines.tune_measure import copy_model


def test_tune_measures_tokens_per_s_of_a_generation_engine_and_keeps_or_improves_its_config(tmp_path: Path):
    repository = tmp_path / "models"
    repository.mkdir()
    model = copy_model(DEFAULT_MODELS_DIR / "tinylm", repository)
    baseline = generation_shape_of(parse((model / "config.pbtxt").read_text()))
    out = tmp_path / "out"
    argv = ["tune", str(model), "--out", str(out), "--write", "--budget-s", "14", "--max-tokens", "8"]
    argv += ["--warmup-s", "0.3", "--measure-s", "0.6"]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    printed = stdout.getvalue()

    assert re.search(r"^\[1/\d+\] seqs=64 kv=16384: [\d.]+ tokens/s p95 \d+ ms \(baseline\)$", printed, re.M), printed
    line = re.fullmatch(
        r'TUNE model=tinylm baseline_tokens_per_s=([\d.]+) best_tokens_per_s=([\d.]+) gain=(-?[\d.]+) chosen="(.+)"',
        printed.strip().splitlines()[-1],
    )
    assert line, printed
    assert float(line.group(1)) > 0 and float(line.group(2)) >= float(line.group(1))

    record = json.loads((out / "tune.json").read_text())
    chosen = record["chosen"]["shape"]
    assert [t["note"] for t in record["trials"][:2]] == ["baseline", "baseline, repeated"]
    assert all(t["shape"]["kv_budget_tokens"] >= 256 * t["shape"]["max_num_seqs"] for t in record["trials"])
    written = generation_shape_of(parse((model / "config.pbtxt").read_text()))
    assert (written.max_num_seqs, written.kv_budget_tokens) == (chosen["max_num_seqs"], chosen["kv_budget_tokens"])
    assert record["written"] is (written != baseline)
    # The engine's comments survive the rewrite.
    assert "# Sequences decoding at once" in (model / "config.pbtxt").read_text()


def test_tune_model_stores_a_generation_entrys_max_num_seqs_and_load_seconds(db, settings, tmp_path: Path):
    from django.core.management import call_command

    from controlplane.fleet.models import CatalogueModel, PlacementEvent

    repository = tmp_path / "models"
    repository.mkdir()
    copy_model(DEFAULT_MODELS_DIR / "tinylm", repository)
    settings.TRITON_MODEL_REPOSITORY = repository
    # The seeded entry disagrees with the config it serves (8 sequences against 64): tuning sets it right.
    entry = CatalogueModel.objects.get(triton_name="tinylm")
    CatalogueModel.objects.filter(id=entry.id).update(max_num_seqs=8)
    stdout = io.StringIO()
    argv = [entry.name, "--budget-s", "1", "--warmup-s", "0.2", "--measure-s", "0.4", "--out", str(tmp_path / "out")]
    call_command("tune_model", *argv, stdout=stdout)

    record = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert [t["note"] for t in record["trials"]] == ["baseline", "baseline, repeated"], stdout.getvalue()
    model = CatalogueModel.objects.get(id=entry.id)
    assert (model.max_num_seqs, model.max_batch_size, model.call_rows) == (64, entry.max_batch_size, entry.call_rows)
    assert model.load_seconds == pytest.approx(record["chosen_load_s"], abs=1e-3) and model.load_seconds < 30.0
    event = PlacementEvent.objects.get(model=model, action="tuned")
    assert event.reason.startswith("TUNE model=tinylm baseline_tokens_per_s=") and "max_num_seqs=64" in event.reason
    assert f"Stored on {entry.name!r}: max_num_seqs=64" in stdout.getvalue()
