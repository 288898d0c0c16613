"""A batch keeps the catalogue entry it was validated against (controlplane/batches/pinning.py): editing,
disabling or re-registering the model mid-batch does not fail its remaining lines."""

from __future__ import annotations

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.fleet.models import CatalogueModel
from tests.batches.test_lifecycle import _create, eager
from tests.support.batches import file_records, tensor_line
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

pytestmark = pytest.mark.django_db(transaction=True)


def _validated_tensor_batch(tenant) -> Batch:
    lines = [tensor_line(f"t{i}", [[float(i), 1.0, 2.0, 3.0]]) for i in range(8)]
    batch = _create(tenant, lines, endpoint="/v2/infer")
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def test_validation_stores_the_entry_it_checked_against(tenant, eager):
    batch = _validated_tensor_batch(tenant)
    identity = CatalogueModel.objects.get(name="identity")
    assert batch.model_snapshot == {
        "name": "identity",
        "triton_name": identity.triton_name,
        "kind": identity.kind,
        "max_batch_size": identity.max_batch_size,
        "call_rows": None,
        "inputs": identity.inputs,
        "outputs": identity.outputs,
        "embedding_dimensions": identity.embedding_dimensions,
        # A generation model's (kinds/generation/kind.py); a tensor model's are their defaults.
        "context_length": None,
        "tokenizer_dir": "",
        "completion_weight": 1.0,
        "max_num_seqs": None,
        "structured_outputs": False,
    }


def test_an_entry_edited_mid_batch_does_not_fail_the_remaining_lines(tenant, eager):
    batch = _validated_tensor_batch(tenant)
    first, *rest = Shard.objects.filter(batch=batch).order_by("index")
    backend = FakeBackend()
    assert run_shard(first, backend) == "succeeded"
    # An operator re-registers the model with another interface, then disables it.
    renamed = [{**spec, "name": "RENAMED"} for spec in CatalogueModel.objects.get(name="identity").inputs]
    CatalogueModel.objects.filter(name="identity").update(inputs=renamed, max_batch_size=1, is_enabled=False)
    for shard in rest:
        assert run_shard(shard, backend) == "succeeded"
    batch = Batch.objects.get(id=batch.id)
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.COMPLETED, 8, 0)
    assert [r["custom_id"] for r in file_records(batch.output_file_id)] == [f"t{i}" for i in range(8)]
    # Calls were still packed by the pinned max_batch_size (4 lines per shard in one call each).
    assert all(call["INPUT0"].shape[0] == 4 for call in backend.calls)


def test_new_batches_see_the_edited_entry(tenant, eager):
    renamed = [{**spec, "name": "RENAMED"} for spec in CatalogueModel.objects.get(name="identity").inputs]
    CatalogueModel.objects.filter(name="identity").update(inputs=renamed)
    batch = _validated_tensor_batch(tenant)
    # Validated against the edited entry: every line names INPUT0, which it no longer has, so every line is a
    # refused body (a 400 line when its shard runs), and the batch pins the edited interface.
    assert batch.status == BatchStatus.IN_PROGRESS and batch.model_snapshot["inputs"][0]["name"] == "RENAMED"
    assert sum(Shard.objects.filter(batch=batch).values_list("body_errors", flat=True)) == batch.total_lines == 8
