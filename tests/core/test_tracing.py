"""Tracing (core/observability/tracing.py) in process: a batch created through the API and run by the services as a worker
would, its spans exported by the real OTLP/HTTP exporter to an in-test OTLP receiver (tests/support/otlp_receiver.py)
and read back as one tree; line errors as events, trace ids on the batch and in JSON logs, sampling per batch,
and nothing at all when tracing is off. The tree on a real stack with Triton's own spans: tests/e2e/test_tracing.py."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch
from controlplane.batches.results.finalize import batch_try_finalize
from controlplane.core.messaging import dispatch
from controlplane.core.observability import tracing
from controlplane.core.observability.logs import JsonFormatter
from tests.support.batches import embedding_line, jsonl, upload
from tests.support.fakes import FakeBackend
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan, one_span, tracing_to
from tests.support.running import run_batch

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    running = OtlpReceiver().start()
    yield running
    running.stop()


@pytest.fixture
def traced(receiver: OtlpReceiver) -> Iterator[OtlpReceiver]:
    with tracing_to(receiver):
        yield receiver


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


def _create(tenant, lines: list[dict]) -> Batch:
    file = upload(tenant, jsonl(lines))
    return services.batch_create(
        tenant=tenant, input_file_id=file.id, endpoint="/v1/embeddings", completion_window="24h"
    )


def _run(batch: Batch, backend: FakeBackend) -> None:
    services.batch_validate(batch_id=batch.id)
    run_batch(batch, backend)
    batch_try_finalize(batch_id=batch.id)


def test_a_batch_is_one_trace_from_create_to_finalize(traced, tenant, quiet, settings):
    settings.SHARD_MAX_LINES = 2
    lines = [embedding_line(f"r{i}", f"text {i}") for i in range(5)] + [embedding_line("bad", "REJECT me")]
    batch = _create(tenant, lines)
    batch.refresh_from_db()
    trace_id = tracing.trace_id_of(batch.trace_parent)
    assert trace_id is not None and len(trace_id) == 32

    _run(batch, FakeBackend())
    spans = traced.trace(trace_id)

    create = one_span(spans, "batch.create")
    assert create.parent_id == ""  # no web instrumentation in process: the create span is the root
    assert create.attributes["batch.id"] == batch.id
    validate = one_span(spans, "batch.validate")
    finalize = one_span(spans, "batch.finalize")
    assert validate.parent_id == create.span_id and finalize.parent_id == create.span_id
    assert finalize.attributes == {"batch.id": batch.id, "batch.completed": 5, "batch.failed": 1}
    shards = sorted((span for span in spans if span.name == "shard.run"), key=lambda s: s.attributes["shard.index"])
    assert [span.attributes["shard.index"] for span in shards] == [0, 1, 2]
    for span in shards:
        assert span.parent_id == create.span_id
        assert span.attributes["batch.id"] == batch.id
        assert span.attributes["shard.attempt"] == 1
        assert span.attributes["shard.outcome"] == "succeeded"
    # The rejected line is an event of its shard's span, with its line number and code, and nothing of the
    # tenant's content (the message, which may quote the line, is in the error file only).
    [(name, event)] = [event for span in shards for event in span.events]
    assert name == "line_error" and event == {"line": 6, "code": event["code"]} and event["code"]
    assert shards[2].attributes["batch.line_errors"] == 1
    assert {span.service for span in spans} == {"controlplane-test"}


def test_the_trace_id_is_on_the_batch_object(traced, tenant, quiet, api):
    file = upload(tenant, jsonl([embedding_line("a", "x")]))
    response = api.post(
        "/v1/batches",
        {"input_file_id": file.id, "endpoint": "/v1/embeddings", "completion_window": "24h"},
        format="json",
    )
    assert response.status_code == 200, response.content
    trace_id = response.json()["trace_id"]
    assert trace_id == tracing.trace_id_of(Batch.objects.get(id=response.json()["id"]).trace_parent)
    assert api.get(f"/v1/batches/{response.json()['id']}").json()["trace_id"] == trace_id
    assert one_span(traced.trace(trace_id), "batch.create")


def test_off_nothing_is_created_or_stored(receiver, tenant, quiet):
    assert not tracing.enabled()
    batch = _create(tenant, [embedding_line("a", "x")])
    _run(batch, FakeBackend())
    batch.refresh_from_db()
    assert batch.trace_parent == "" and batch.status == "completed"
    assert receiver.requests == 0


def test_an_unsampled_batch_keeps_its_trace_id_but_exports_nothing(receiver, tenant, quiet):
    with tracing_to(receiver, sampler=tracing.sampler_for("parentbased_traceidratio", 0.0)):
        batch = _create(tenant, [embedding_line("a", "x"), embedding_line("b", "y")])
        _run(batch, FakeBackend())
        batch.refresh_from_db()
    # Not sampled (the flags' low bit), decided once at create; the trace id still names the batch's logs.
    assert int(batch.trace_parent[-2:], 16) & 1 == 0, batch.trace_parent
    assert batch.status == "completed" and receiver.spans == []


def test_json_logs_carry_the_current_trace_id(traced):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("controlplane.test_tracing")
    logger.addHandler(handler)
    try:
        with tracing.span("shard.run") as span:
            logger.warning("inside")
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert inside["span_id"] == format(span.get_span_context().span_id, "016x")
    assert "trace_id" not in outside


@pytest.mark.parametrize(
    ("name", "ratio", "description"),
    [
        ("parentbased_always_on", 1.0, "ParentBased{root:AlwaysOnSampler"),
        ("parentbased_traceidratio", 0.25, "ParentBased{root:TraceIdRatioBased{0.25}"),
        ("always_off", 1.0, "AlwaysOffSampler"),
    ],
)
def test_sampler_names(name, ratio, description):
    assert tracing.sampler_for(name, ratio).get_description().startswith(description)


@pytest.fixture
def edge_propagation() -> Iterator[None]:
    """The web's propagation (installed by tracing_setup_from_settings for role web), restored afterwards."""
    from opentelemetry import propagate

    before = propagate.get_global_textmap()
    tracing.edge_propagation_install()
    yield
    propagate.set_global_textmap(before)


CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def _request_span(sampler_name: str) -> list:
    """A request carrying a client's sampled traceparent, extracted and started as Django's instrumentation does
    (the global propagator's extract, then a SERVER span in that context, a child span under it)."""
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = tracing.tracing_configure(
        service_name="edge-test", exporter=exporter, batched=False, sampler=tracing.sampler_for(sampler_name, 1.0)
    )
    try:
        context = propagate.extract({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        tracer = trace.get_tracer("edge-test", tracer_provider=provider)
        with (
            tracer.start_as_current_span("POST /v1/batches", context=context, kind=trace.SpanKind.SERVER),
            tracer.start_as_current_span("batch.create"),
        ):
            pass
        return list(exporter.get_finished_spans())
    finally:
        tracing.tracing_configure(service_name="", exporter=None)


def test_a_clients_sampled_flag_does_not_make_the_service_trace(edge_propagation):
    assert _request_span("parentbased_always_off") == []


def test_a_client_traceparent_is_a_link_of_a_trace_of_the_services_own(edge_propagation):
    spans = {span.name: span for span in _request_span("parentbased_always_on")}
    root, child = spans["POST /v1/batches"], spans["batch.create"]
    assert root.parent is None and format(root.context.trace_id, "032x") != CLIENT_TRACE
    [link] = root.links
    assert (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x")) == (CLIENT_TRACE, CLIENT_SPAN)
    assert child.parent.span_id == root.context.span_id and not child.links  # the link is on the root only
