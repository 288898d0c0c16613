"""OpenTelemetry tracing: one trace per batch (docs/architecture/tracing.md, "Traces").

The batch's trace starts at its create request (``batch.create``, under Django's request span when the web
is instrumented) and its W3C ``traceparent`` is stored on the batch row. Every later stage runs in another
process, often much later, and is reached by a message (the outbox, a slot) or by beat (the rescuer, the
stuck-finalize sweep): each opens its span with the stored traceparent as parent (``batch_span``), so
validation, every shard attempt, their Triton calls and finalization hang under one root whatever carried
the work there. Triton calls send the traceparent on to Triton (``outgoing``).

Off unless ``TRACING_ENDPOINT`` (``OTEL_EXPORTER_OTLP_ENDPOINT``) is set: then nothing is created at all,
no trace id is stored and the hot path pays one boolean test per shard and per call. On, spans go over OTLP
(HTTP/protobuf, the protocol Triton's own exporter speaks) through a batching processor, sampled per batch:
the create request's sampler decides (``OTEL_TRACES_SAMPLER``, ``parentbased_*`` by default) and every
later span follows the stored flag, so an unsampled batch costs context handling only.

No Django at import time: the log formatter (core/observability/logs.py) reads the current span's ids."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

SAMPLERS = (
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
    "always_on",
    "always_off",
    "traceidratio",
)
# Line errors recorded per span: a shard of 4,096 bad lines keeps its first ones, and says how many it had.
MAX_LINE_EVENTS = 100

_PROPAGATOR = TraceContextTextMapPropagator()
_state: dict[str, Any] = {"tracer": None, "provider": None}


def sampler_for(name: str, ratio: float) -> Sampler:
    """The OTEL_TRACES_SAMPLER names (the spec's), built here so a bad name stops start-up (settings)."""
    static: dict[str, Sampler] = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF}
    root = static.get(name.removeprefix("parentbased_")) or TraceIdRatioBased(ratio)
    return ParentBased(root) if name.startswith("parentbased_") else root


# Where the web's propagator leaves a client's span context (EdgeTraceContext), for _ClientLink.
_CLIENT_SPAN = otel_context.create_key("controlplane.client_span")


class EdgeTraceContext(TextMapPropagator):
    """The web's propagator: a client's ``traceparent`` never becomes the parent of the request's span. Its
    sampled flag would decide for the service whether a batch is traced (a client could have every batch
    traced), and its trace id which trace the batch joins. The request starts a trace of its own, sampled by the
    service's sampler, and the client's span is kept as a link on the request's root span (_ClientLink)."""

    def extract(self, carrier: CarrierT, context: Context | None = None, getter: Getter = default_getter) -> Context:
        client = trace.get_current_span(_PROPAGATOR.extract(carrier, getter=getter)).get_span_context()
        start = context if context is not None else Context()
        return otel_context.set_value(_CLIENT_SPAN, client, start) if client.is_valid else start

    def inject(self, carrier: CarrierT, context: Context | None = None, setter: Setter = default_setter) -> None:
        _PROPAGATOR.inject(carrier, context=context, setter=setter)

    @property
    def fields(self) -> set[str]:
        return _PROPAGATOR.fields


class _ClientLink(SpanProcessor):
    """Links a request's root span to the client's span that EdgeTraceContext set aside."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        client = otel_context.get_value(_CLIENT_SPAN, parent_context)
        if isinstance(client, trace.SpanContext) and getattr(span, "parent", None) is None:
            span.add_link(client, {"controlplane.link": "client"})

    def on_end(self, span: ReadableSpan) -> None:
        pass


def edge_propagation_install() -> None:
    """The web process reads incoming trace context through EdgeTraceContext (Django's instrumentation
    extracts with the global propagator)."""
    propagate.set_global_textmap(EdgeTraceContext())


def tracing_configure(
    *,
    service_name: str,
    exporter: SpanExporter | None,
    sampler: Sampler | None = None,
    batched: bool = True,
) -> TracerProvider | None:
    """Start tracing in this process (``exporter`` None: stop it). Tests pass an in-memory or in-test OTLP
    exporter with ``batched=False`` so every span is exported when it ends."""
    old = _state["provider"]
    if old is not None:
        old.shutdown()
    if exporter is None:
        _state.update(tracer=None, provider=None)
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}), sampler=sampler)
    processor = BatchSpanProcessor(exporter) if batched else SimpleSpanProcessor(exporter)
    provider.add_span_processor(_ClientLink())  # first: the link is on the span before it is exported
    provider.add_span_processor(processor)
    _state.update(tracer=provider.get_tracer("controlplane"), provider=provider)
    return provider


def tracing_setup_from_settings(*, role: str) -> None:
    """CoreConfig.ready: export over OTLP/HTTP when settings.TRACING_ENDPOINT is set; the web's requests
    get Django's instrumentation (its server span is the create span's parent)."""
    from django.conf import settings

    if not settings.TRACING_ENDPOINT or _state["provider"] is not None:
        return
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = settings.TRACING_ENDPOINT.rstrip("/") + "/v1/traces"
    provider = tracing_configure(
        service_name=f"{settings.TRACING_SERVICE_NAME}-{role}",
        exporter=OTLPSpanExporter(endpoint=endpoint),
        sampler=sampler_for(settings.TRACING_SAMPLER, settings.TRACING_SAMPLER_RATIO),
    )
    if role == "web":
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        edge_propagation_install()

        # Probes and scrapes would each be a trace of their own; the API's requests are what support follows.
        DjangoInstrumentor().instrument(tracer_provider=provider, excluded_urls="healthz,readyz,metrics,static")


def tracing_flush(timeout_ms: int = 5000) -> None:
    provider = _state["provider"]
    if provider is not None:
        provider.force_flush(timeout_ms)


def enabled() -> bool:
    return _state["tracer"] is not None


def _tracer() -> Tracer:
    tracer: Tracer = _state["tracer"]
    return tracer


def current_traceparent() -> str:
    """The current span's W3C traceparent ('' when none): what a batch stores and a Triton call sends."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent", "")


def trace_id_of(traceparent: str) -> str | None:
    """The 32-hex trace id of a stored traceparent (None for '' or a malformed value)."""
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


def current_ids() -> dict[str, str]:
    """trace_id and span_id of the current span, for log lines; {} outside any span."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


def span(name: str, *, attributes: Mapping[str, Any] | None = None) -> Any:
    """A child of the current span (a no-op context when tracing is off)."""
    if not enabled():
        return nullcontext(None)
    return _tracer().start_as_current_span(name, attributes=_clean(attributes))


def batch_span(name: str, *, traceparent: str, attributes: Mapping[str, Any] | None = None) -> Any:
    """A stage of a batch: a child of the batch's stored traceparent, whatever the current context is (a
    slot serves many batches; beat's sweeps have none). A batch created with tracing off has none: then
    no span, rather than a stray root trace per stage."""
    if not enabled() or not traceparent:
        return nullcontext(None)
    parent = _PROPAGATOR.extract({"traceparent": traceparent})
    return _tracer().start_as_current_span(name, context=parent, attributes=_clean(attributes))


@contextmanager
def outgoing(name: str, *, attributes: Mapping[str, Any] | None = None) -> Iterator[dict[str, str] | None]:
    """A client span around one call to another service, yielding the headers that continue the trace
    there (None when there is no trace to continue)."""
    if not enabled() or not trace.get_current_span().get_span_context().is_valid:
        yield None
        return
    with _tracer().start_as_current_span(name, kind=SpanKind.CLIENT, attributes=_clean(attributes)):
        headers: dict[str, str] = {}
        _PROPAGATOR.inject(headers)
        yield headers


class LineErrors:
    """Per-line errors of one span as span events, at most MAX_LINE_EVENTS of them; the total is an attribute.
    An event holds the line's number and error code only: a message can quote the tenant's line, and a trace is
    read by operators and kept by a collector outside the tenant's data (the error file has the message).
    Thread-safe as the SDK's span is: a shard's calls finish in a pool."""

    def __init__(self, target: Span | None) -> None:
        self.span = target if target is not None and target.is_recording() else None
        self.count = 0

    def add(self, *, line: int, code: str) -> None:
        if self.span is None:
            return
        self.count += 1
        if self.count <= MAX_LINE_EVENTS:
            self.span.add_event("line_error", {"line": line, "code": code})

    def close(self) -> None:
        if self.span is not None and self.count:
            self.span.set_attribute("batch.line_errors", self.count)


def current_line_errors() -> LineErrors:
    return LineErrors(trace.get_current_span() if enabled() else None)


def span_fail(target: Span | None, message: str) -> None:
    """Mark a span failed without an exception (an outcome such as a shard given back)."""
    if target is not None and target.is_recording():
        target.set_status(Status(StatusCode.ERROR, message[:500]))


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    # OTel attributes may not be None.
    return {key: value for key, value in attributes.items() if value is not None} if attributes else None
