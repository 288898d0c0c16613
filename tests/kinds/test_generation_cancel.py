"""Cancelling a running generation batch on a real tritonserver with tinylm: the shard's worker sees the cancel,
sends nothing more, closes its stream with cancel (Triton flags every request on it; the engine drops them at
its next step) and publishes the lines that finished. Asserted: the order of events (cancel → the worker sees it
→ stream closed → shard stopped) and that nothing is delivered after the close; the times are reported, not
held to a limit (the development host is shared and loaded)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard, ShardStatus
from controlplane.batches.run import execution
from controlplane.core.messaging import dispatch
from controlplane.fleet.backend import TritonBackend
from controlplane.fleet.models import CatalogueModel
from controlplane.scheduling.runner import shard_run_next
from tests.kinds.test_generation_batch import CHAT, _records, chat_line
from tests.support.batches import jsonl, upload
from tests.support.triton_fixture import (
    pytest_runtest_makereport,
    triton_client,
    triton_model_repository,
    triton_server,
)

pytestmark = pytest.mark.django_db(transaction=True)  # the cancel comes from another thread's connection
LINES = 1024  # ~30k generated tokens: ten seconds of the engine and more; the cancel comes early


class _RecordingStream:
    def __init__(self, stream: Any, events: list[tuple[str, float]]) -> None:
        self.stream, self.events = stream, events

    def submit(self, request: Any) -> None:
        self.stream.submit(request)

    def close(self, *, cancel: bool = False) -> None:
        self.events.append(("closing_with_cancel" if cancel else "closing", time.monotonic()))
        self.stream.close(cancel=cancel)  # the stream fails what is still in flight, then its reader ends
        self.events.append(("closed", time.monotonic()))


class _RecordingBackend:
    """The worker's TritonBackend, recording when final responses arrive and when the stream is closed."""

    def __init__(self, backend: TritonBackend) -> None:
        self.backend, self.server, self.instances = backend, backend.server, backend.instances
        self.gpus = backend.gpus
        self.events: list[tuple[str, float]] = []

    def prepare(self, triton_model: str) -> None:
        self.backend.prepare(triton_model)

    def infer(self, *args: Any) -> Any:
        return self.backend.infer(*args)

    def generation_stream(self, triton_model: str, *, on_response: Any) -> Any:
        def record(response: Any) -> None:
            if response.final:
                self.events.append(("final" if response.error is None else "failed", time.monotonic()))
            on_response(response)

        return _RecordingStream(self.backend.generation_stream(triton_model, on_response=record), self.events)


def test_a_cancel_stops_generation_and_keeps_the_finished_lines(
    tenant, triton_client, triton_server, settings, monkeypatch
):
    triton_client.ensure_loaded("tinylm")
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES, settings.SCHEDULER_SHARD_SECONDS = LINES, 0  # one shard: the cancel lands in it
    lines = [chat_line(f"c{i}", f"count from {i % 20} to 40", temperature=0, max_tokens=60) for i in range(LINES)]
    batch = services.batch_create(
        tenant=tenant, input_file_id=upload(tenant, jsonl(lines)).id, endpoint=CHAT, completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    backend = _RecordingBackend(TritonBackend(triton_client, triton_server.grpc_url))
    events = backend.events

    # When the worker first finds its batch stopping (its once-a-second look): "the cancel reached the worker".
    real_stop_requested = execution.batch_stop_requested

    def stop_requested(*, batch_id: str) -> bool:
        stopping = real_stop_requested(batch_id=batch_id)
        if stopping and not any(name == "seen_by_worker" for name, _ in events):
            events.append(("seen_by_worker", time.monotonic()))
        return stopping

    monkeypatch.setattr(execution, "batch_stop_requested", stop_requested)

    def cancel_after_some_lines() -> None:
        deadline = time.monotonic() + 300
        while sum(name == "final" for name, _ in events) < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        events.append(("cancel", time.monotonic()))
        services.batch_cancel(batch=Batch.objects.get(id=batch.id))

    canceller = threading.Thread(target=cancel_after_some_lines)
    canceller.start()
    model = CatalogueModel.objects.get(name="tinylm")
    cycle = shard_run_next(model=model, owner="test", backend_factory=lambda name: backend)
    returned = time.monotonic()
    canceller.join()

    assert cycle is not None and cycle.outcome == "stopped", cycle
    at = {name: t for name, t in events if name not in ("final", "failed")}
    assert list(at) == ["cancel", "seen_by_worker", "closing_with_cancel", "closed"], events
    assert at["cancel"] <= at["seen_by_worker"] <= at["closing_with_cancel"] <= at["closed"] <= returned
    finals = [t for name, t in events if name == "final"]
    # Lines still in flight when the worker stopped are failed by the closing stream (Triton cancels them in
    # the engine: tests/triton/test_triton_tinylm.py); nothing at all arrives once it is closed.
    failed = [t for name, t in events if name == "failed"]
    assert failed and all(at["closing_with_cancel"] <= t <= at["closed"] for t in failed)
    assert not [t for t in finals if t > at["closed"]], "responses delivered after the stream closed"
    print(
        f"\ncancel → seen by the worker {at['seen_by_worker'] - at['cancel']:.2f} s; seen → stream cancelled "
        f"{at['closing_with_cancel'] - at['seen_by_worker']:.2f} s, closed {at['closed'] - at['seen_by_worker']:.2f} s;"
        f" → shard stopped {returned - at['seen_by_worker']:.2f} s; {len(finals)} of {LINES} lines finished,"
        f" {len(failed)} cancelled in flight"
    )

    # The finished lines are kept, the rest are batch_cancelled lines; every line is in exactly one file.
    shard = Shard.objects.get(batch=batch)
    assert shard.status == ShardStatus.STOPPED and 16 <= shard.completed_lines < LINES
    batch = Batch.objects.get(id=batch.id)
    assert batch.status == BatchStatus.CANCELLED
    output, errors = _records(batch.output_file_id), _records(batch.error_file_id)
    assert set(output).isdisjoint(errors) and len(output) + len(errors) == LINES
    assert len(output) == batch.completed_lines == shard.completed_lines
    # The part holds exactly the lines whose answer arrived before the worker stopped reading.
    assert len(output) == len([t for t in finals if t <= at["closing_with_cancel"]])
    assert {r["error"]["code"] for r in errors.values()} == {"batch_cancelled"}
    # Only what finished is billed: the Batch object's usage counts the kept lines' tokens.
    assert batch.completion_tokens == sum(r["response"]["body"]["usage"]["completion_tokens"] for r in output.values())
