"""A cancel does not wait for calls a hung Triton never answers (found by tests/chaos: a cancel issued
during a SIGSTOPped Triton completed only when the pause ended, or at the call deadline)."""

from __future__ import annotations

import threading
import time

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from tests.support.batches import jsonl, tensor_line, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_abandons_calls_stuck_on_a_hung_server(tenant, settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.DISPATCH_INFLIGHT_CALLS = 2
    # Rows of different widths are not stacked: one call per line.
    lines = [tensor_line(f"t{i}", [[1.0] * (i + 1)]) for i in range(6)]
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    hang = threading.Event()

    def on_call(number: int) -> None:
        if number == 2:  # the server hangs from the second call on; the batch is cancelled meanwhile
            services.batch_cancel(batch=Batch.objects.get(id=batch.id))
        if number >= 2:
            hang.wait(60)

    try:
        started = time.monotonic()
        outcome = run_shard(Shard.objects.get(batch=batch), FakeBackend(on_call=on_call), owner="t")
        took = time.monotonic() - started
    finally:
        hang.set()
    assert outcome == "stopped" and took < 10, (outcome, took)
    assert Shard.objects.get(batch=batch).status == ShardStatus.STOPPED
    batch_try_finalize(batch_id=batch.id)
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED
    assert batch.completed_lines == 1 and batch.failed_lines == 5
