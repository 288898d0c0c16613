"""One batch, one trace, on a real stack: gunicorn (Django instrumented), the control and shard workers, beat
and the runner's own tritonserver in OpenTelemetry trace mode (LOCAL_TRITON_TRACING=1), every process exporting
over OTLP/HTTP to an in-test receiver (tests/support/otlp_receiver.py) that decodes what arrives with opentelemetry-proto.

The tree asserted: the API's request span → batch.create → batch.validate, one shard.run per shard (batch,
shard and attempt attributes; a refused line as an event), each shard's triton.infer calls under it, Triton's
own InferRequest span under each call (the traceparent crossed into the server), and batch.finalize. The trace
id is on the batch object and in the JSON log lines of the processes that worked on it.

Its own stack and its own Redis database (E2E_TRACE_BROKER_URL), like tests/e2e/test_observability.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.local.databases import migrated_database
from deploy.local.stack import Stack, find_free_port
from tests.e2e.conftest import E2E, broker_env
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan, one_span
from tests.support.stack import submit, tensor_lines
from tests.support.stack_tenants import tenant_key

pytestmark = pytest.mark.e2e

TRACE_BROKER_URL = os.environ.get("E2E_TRACE_BROKER_URL", "redis://127.0.0.1:6379/9")
LINES = 40  # three shards of 16
SERVER, CLIENT = 2, 3  # OTLP SpanKind values


class TracedStack(E2E):
    def __init__(self, stack: Stack, db_url: str, api_key: str, receiver: OtlpReceiver):
        super().__init__(stack, db_url, api_key)
        self.receiver = receiver


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> Iterator[TracedStack]:
    receiver = OtlpReceiver().start()
    try:
        with migrated_database("cp_trace") as db_url:
            yield from _traced_stack(tmp_path_factory, db_url, receiver)
    finally:
        receiver.stop()


def _traced_stack(tmp_path_factory, db_url: str, receiver: OtlpReceiver) -> Iterator[TracedStack]:
    env = {
        "DATABASE_URL": db_url,
        **broker_env(TRACE_BROKER_URL),
        "SHARD_MAX_LINES": "16",
        "LOG_FORMAT": "json",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # the SDK's export interval (ms): the test waits less
        "LOCAL_TRITON_TRACING": "1",
    }
    stack = Stack(
        var_dir=Path(tmp_path_factory.mktemp("trace-stack")),
        web_port=find_free_port(),
        env=env,
        worker_concurrency=2,
        with_triton=True,
        warm_models=("identity",),
    )
    stack.start()
    try:
        key = tenant_key(db_url, "trace-tenant")
        yield TracedStack(stack, db_url, key, receiver)
    finally:
        stack.stop()


def _triton_requests(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    """Triton's InferRequest spans of the batch's calls: those that continue its trace, and the roots Triton
    started instead while the batch ran. Triton's gRPC frontend (the pip-installed server) starts a new root
    trace for a few percent of calls that carry a valid traceparent (measured: 4-20 of 300 fresh traceparents,
    none over HTTP; resending a lost one continues it: scripts/triton_trace_probe.py), so a call's span may
    land in a trace of its own; docs/architecture/tracing.md, "Known limits"."""
    calls = [span for span in spans if span.trace_id == trace_id and span.name == "triton.infer"]
    if not calls:
        return []
    first, last = min(span.start_ns for span in calls), max(span.end_ns for span in calls)
    return [
        span
        for span in spans
        if span.name == "InferRequest"
        and (span.trace_id == trace_id or (not span.parent_id and first <= span.start_ns <= last))
    ]


def _children(spans: list[ReceivedSpan], parent: ReceivedSpan, name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.parent_id == parent.span_id and span.name == name]


def test_a_batch_is_one_trace_across_processes_and_into_triton(traced: TracedStack):
    client = traced.sdk()
    lines = tensor_lines(LINES, prefix="tr")
    # A body the model refuses (a tensor it has no input for): a 400 line, an event of its shard's span.
    lines[20]["body"]["inputs"][0]["name"] = "NO_SUCH_INPUT"
    batch = submit(client, lines, endpoint="/v2/infer")
    trace_id = batch.model_extra["trace_id"]
    assert trace_id and len(trace_id) == 32
    batch = traced.wait_status(client, batch.id, {"completed", "failed", "expired", "cancelled"}, timeout_s=300)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES - 1, 1)
    assert client.batches.retrieve(batch.id).model_extra["trace_id"] == trace_id

    def whole(spans: list[ReceivedSpan]) -> bool:
        # Every span asserted on below: each process exports on its own schedule, so the finalize span (often the
        # shard worker's last) and the calls (children, ended first) can arrive before a shard's own span.
        ours = [span for span in spans if span.trace_id == trace_id]
        names = [span.name for span in ours]
        calls = names.count("triton.infer")
        shards = names.count("shard.run")
        return (
            any(span.parent_id == "" for span in ours)
            and "batch.create" in names
            and "batch.finalize" in names
            and "batch.validate" in names
            and shards >= 3
            and calls >= 3
            and len(_triton_requests(spans, trace_id)) >= calls
        )

    received = traced.receiver.wait_for(whole, timeout_s=120)
    spans = traced.receiver.trace(trace_id)

    # The API: Django's server span of POST /v1/batches, the root, in the web process.
    [request] = [span for span in spans if span.parent_id == ""]
    assert request.kind == SERVER and request.service == "controlplane-web"
    assert request.attributes.get("http.response.status_code", request.attributes.get("http.status_code")) == 200
    [create] = _children(spans, request, "batch.create")
    assert create.attributes["batch.id"] == batch.id

    [validate] = _children(spans, create, "batch.validate")
    assert validate.service == "controlplane-worker" and validate.attributes["batch.id"] == batch.id

    shards = sorted(_children(spans, create, "shard.run"), key=lambda span: span.attributes["shard.index"])
    assert [span.attributes["shard.index"] for span in shards] == [0, 1, 2]
    for shard in shards:
        assert shard.attributes["batch.id"] == batch.id
        assert shard.attributes["shard.attempt"] == 1 and shard.attributes["shard.outcome"] == "succeeded"
        assert shard.start_ns >= validate.start_ns
        calls = _children(spans, shard, "triton.infer")
        assert calls, f"shard {shard.attributes['shard.index']} has no Triton call span"
        for call in calls:
            assert call.kind == CLIENT and call.attributes["model"] == "identity"
            assert len(_children(spans, call, "InferRequest")) <= 1
    # Triton's own span continues the calls' traceparent inside the server: every call is answered by one
    # InferRequest span, in this trace or (Triton's gRPC frontend, a few percent of calls) a root of its own.
    continued = [span for span in spans if span.name == "InferRequest"]
    assert continued and all(span.service == "triton" for span in continued)
    calls = [span for span in spans if span.name == "triton.infer"]
    assert len(_triton_requests(received, trace_id)) >= len(calls)
    assert sum(span.attributes.get("rows", 0) for span in spans if span.name == "triton.infer") >= LINES - 1
    [(event, fields)] = [event for shard in shards for event in shard.events]
    assert event == "line_error" and fields["line"] == 21 and shards[1].attributes["batch.line_errors"] == 1

    [finalize] = _children(spans, create, "batch.finalize")
    assert finalize.attributes["batch.completed"] == LINES - 1 and finalize.attributes["batch.failed"] == 1
    assert finalize.end_ns >= max(shard.end_ns for shard in shards)

    # Support goes from the batch to its trace, and from the trace to the log lines of every process that worked.
    logged = set()
    for name in ("web", "validation", "worker"):
        for line in (traced.stack.log_dir / f"{name}.log").read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("trace_id") == trace_id:
                logged.add(name)
    assert logged >= {"validation", "worker"}, logged
    assert one_span(spans, "batch.create").span_id == create.span_id
