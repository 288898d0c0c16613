"""Calls are packed to the catalogue entry's call_rows (the served config's largest preferred batch size, which
`manage.py tune_model` stores), within max_batch_size; without it, to max_batch_size. Through the real shard path
(validation, columns or parsed lines, a FakeBackend recording each call's rows)."""

from __future__ import annotations

import pytest

from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.pinning import pinned_model
from controlplane.core.messaging import dispatch
from controlplane.fleet.catalogue.tuning import TunedProfile, catalogue_record_tuning
from controlplane.fleet.models import CatalogueModel, PlacementEvent
from tests.support.batches import embedding_line, tensor_line, validated_batch
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def quiet(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.BATCH_EARLY_DISPATCH = False


def _rows_per_call(batch: Batch) -> list[int]:
    backend = FakeBackend()
    for shard in Shard.objects.filter(batch=batch).order_by("index"):
        assert run_shard(shard, backend, owner="w") == "succeeded"
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED and batch.completed_lines == batch.total_lines
    return [len(next(iter(call.values()))) for call in backend.calls]


def _tensor_lines() -> list[dict]:
    lines = [tensor_line(f"r-{i}", [[float(i), 1.0, 2.0, 3.0]]) for i in range(20)]
    lines[7] = tensor_line("r-7", [[7.0, 1.0, 2.0, 3.0]] * 5)  # more rows than a call's target: it goes whole
    return lines


@pytest.mark.parametrize("columns", [True, False])
def test_tensor_calls_hold_call_rows(tenant, quiet, settings, columns):
    settings.BATCH_SHARD_COLUMNS = columns
    CatalogueModel.objects.filter(name="identity").update(call_rows=4)
    batch = validated_batch(tenant, _tensor_lines(), endpoint="/v2/infer")
    rows = _rows_per_call(batch)
    assert sum(rows) == 24 and max(rows) == 5 and sorted(rows).count(5) == 1
    assert all(r <= 4 for r in rows if r != 5)


def test_without_call_rows_tensor_calls_fill_max_batch_size(tenant, quiet):
    assert CatalogueModel.objects.get(name="identity").call_rows is None
    batch = validated_batch(tenant, _tensor_lines(), endpoint="/v2/infer")
    assert _rows_per_call(batch) == [24]  # one call: 24 rows fit identity's max_batch_size


def test_text_calls_hold_call_rows(tenant, quiet):
    CatalogueModel.objects.filter(name="all-MiniLM-L6-v2").update(call_rows=4)
    lines = [embedding_line(f"e-{i}", f"text number {i} " * (1 + i % 5)) for i in range(18)]
    batch = validated_batch(tenant, lines, endpoint="/v1/embeddings")
    rows = _rows_per_call(batch)
    # 18 texts in calls of 4 at most: five at least, more where a call of the longest would cost too much.
    assert sum(rows) == 18 and max(rows) <= 4 and len(rows) >= 5


def test_call_rows_is_pinned_with_the_batch(tenant, quiet):
    CatalogueModel.objects.filter(name="identity").update(call_rows=4)
    batch = validated_batch(tenant, _tensor_lines(), endpoint="/v2/infer")
    CatalogueModel.objects.filter(name="identity").update(call_rows=None)  # an edit while the batch runs
    assert pinned_model(batch.model_snapshot).rows_per_call == 4
    assert max(r for r in _rows_per_call(batch) if r != 5) <= 4


def test_a_tuned_profile_stores_call_rows(catalogue):
    profile = TunedProfile(
        max_batch_size=32,
        call_rows=16,
        load_seconds=1.5,
        memory_per_instance_bytes=None,
        model_seconds_per_work_unit=None,
        summary="TUNE model=identity",
    )
    model = catalogue_record_tuning(name="identity", profile=profile, actor="test")
    assert (model.max_batch_size, model.call_rows, model.rows_per_call) == (32, 16, 16)
    assert "call_rows=16" in PlacementEvent.objects.get(model=model, action="tuned").reason
    untuned = catalogue_record_tuning(
        name="identity", profile=TunedProfile(32, None, 1.5, None, None, "TUNE model=identity"), actor="test"
    )
    assert untuned.call_rows is None and untuned.rows_per_call == 32
