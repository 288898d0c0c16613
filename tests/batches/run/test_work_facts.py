"""What the shard table tells fleet (batches/run/work_facts.py): the demand and backlog the planner and the
fleet-size loop read count every shard the scheduler may claim, including the early-dispatched shards of a
batch still validating (batches/intake/early_dispatch.py)."""

from __future__ import annotations

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.run.work_facts import ShardWork
from controlplane.core.messaging import dispatch
from tests.support.batches import jsonl, tensor_line, upload

pytestmark = pytest.mark.django_db


@pytest.fixture
def batch(tenant, monkeypatch) -> Batch:
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    file = upload(tenant, jsonl([tensor_line(f"r-{i}", [[1.0, 2.0]]) for i in range(40)]))
    created = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=created.id)
    return Batch.objects.get(id=created.id)


@pytest.mark.parametrize("status", [BatchStatus.IN_PROGRESS, BatchStatus.VALIDATING])
def test_runnable_shards_count_as_demand_and_backlog(batch, status):
    # A validating batch's shards run before the rest of its file is checked: its model is busy. Counting only
    # in-progress batches made such a model look idle to the planner, which evicted its only instance while
    # the shards ran (tests/e2e/test_consolidation.py caught it under load).
    Batch.objects.filter(id=batch.id).update(status=status)
    first = Shard.objects.filter(batch=batch).order_by("index").first()
    Shard.objects.filter(id=first.id).update(status=ShardStatus.RUNNING)
    demand = ShardWork().demand_by_model()["identity"]
    assert (demand.pending_lines, demand.in_flight_shards) == (40, 1)
    (backlog,) = ShardWork().schedulable_backlog()
    assert (backlog.model, backlog.lines, backlog.running_shards) == ("identity", 40, 1)


@pytest.mark.parametrize("status", [BatchStatus.FINALIZING, BatchStatus.CANCELLING, BatchStatus.COMPLETED])
def test_shards_of_batches_that_no_longer_run_are_not_demand(batch, status):
    Batch.objects.filter(id=batch.id).update(status=status)
    assert ShardWork().demand_by_model() == {}
    assert ShardWork().schedulable_backlog() == []
