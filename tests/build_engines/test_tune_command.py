"""`manage.py tune_model NAME`: the tuner run for a catalogue model, its figures stored on the entry.

The model is test_tune_serving.py's sleeping one in a tmp repository. A budget that only measures the baseline
keeps the served config, so the figures (load time, memory, seconds per row) are those of what is served."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from controlplane.fleet.models import CatalogueModel, ModelKind, PlacementEvent
from tests.build_engines.test_tune_serving import CONFIG, MODEL


def test_tune_model_stores_the_measured_profile_of_the_served_config(db, settings, tmp_path: Path):
    repository = tmp_path / "models"
    (repository / "slow_batcher" / "1").mkdir(parents=True)
    (repository / "slow_batcher" / "config.pbtxt").write_text(CONFIG)
    (repository / "slow_batcher" / "1" / "model.py").write_text(MODEL)
    settings.TRITON_MODEL_REPOSITORY = repository
    settings.SCHEDULER_CALLS_PER_INSTANCE, settings.DISPATCH_INFLIGHT_CALLS = 6, 3
    # The entry disagrees with the config it serves (16 rows a call against 8): tuning sets it right.
    CatalogueModel.objects.create(name="slow", triton_name="slow_batcher", kind=ModelKind.TENSOR, max_batch_size=16)
    stdout = io.StringIO()
    argv = ["slow", "--budget-s", "1", "--warmup-s", "0.2", "--measure-s", "0.4", "--out", str(tmp_path / "out")]
    call_command("tune_model", *argv, stdout=stdout)

    record = json.loads((tmp_path / "out" / "tune.json").read_text())
    assert [t["note"] for t in record["trials"]] == ["baseline", "baseline, repeated"], stdout.getvalue()
    assert record["load"]["concurrency"] == 6
    model = CatalogueModel.objects.get(name="slow")
    assert model.max_batch_size == 8
    assert model.load_seconds == pytest.approx(record["chosen_load_s"], abs=1e-3) and model.load_seconds < 10.0
    assert model.memory_per_instance_bytes == record["memory"]["config_bytes"] > 10 * 1024**2
    # Two slots (6 calls in flight, 3 a shard) share the rows/s: each sees 2 / rows_per_s a row.
    assert model.model_seconds_per_work_unit == pytest.approx(2 / record["chosen"]["rows_per_s"])
    event = PlacementEvent.objects.get(model=model, action="tuned")
    assert event.reason.startswith("TUNE model=slow_batcher ") and "max_batch_size=8" in event.reason
    assert (repository / "slow_batcher" / "config.pbtxt").read_text() == CONFIG
    assert "Stored on 'slow'" in stdout.getvalue()


def test_tune_model_refuses_an_unknown_name(db):
    with pytest.raises(CommandError, match="no catalogue model named 'nope'"):
        call_command("tune_model", "nope")
