"""An OTLP/HTTP trace receiver for tests: a real HTTP server on a free port that takes what an OTLP exporter
posts to ``/v1/traces`` (protobuf ``ExportTraceServiceRequest``, as the Python SDK's exporter and Triton's
send it; JSON too) and keeps every span, decoded with opentelemetry-proto, for the test to read."""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status_code: int
    start_ns: int
    end_ns: int


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _attributes(items: Any) -> dict[str, Any]:
    return {item.key: _value(item.value) for item in items}


_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def _ids_as_base64(document: Any) -> Any:
    """OTLP/JSON writes span and trace ids in hex (Triton's exporter does); protobuf's JSON mapping reads
    bytes as base64."""
    if isinstance(document, list):
        return [_ids_as_base64(item) for item in document]
    if not isinstance(document, dict):
        return document
    return {
        key: base64.b64encode(bytes.fromhex(value)).decode() if key in _ID_KEYS and value else _ids_as_base64(value)
        for key, value in document.items()
    }


def decode(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=service,
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes=_attributes(span.attributes),
                        events=tuple((event.name, _attributes(event.attributes)) for event in span.events),
                        status_code=span.status.code,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0
    # Posts the receiver could not decode (the exporter is answered 400 and drops them): a test that waits
    # for spans says so instead of only timing out.
    refused: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """The OTEL_EXPORTER_OTLP_ENDPOINT to give exporters (they post to <endpoint>/v1/traces)."""
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                request = ExportTraceServiceRequest()
                try:
                    if "json" in (self.headers.get("Content-Type") or ""):
                        json_format.ParseDict(_ids_as_base64(json.loads(body)), request)
                    else:
                        request.ParseFromString(body)
                except Exception as exc:  # noqa: BLE001 - any undecodable post is recorded, then refused
                    with receiver._lock:
                        receiver.refused.append(f"{type(exc).__name__}: {exc}; body {body[:300]!r}")
                    self.send_error(400)
                    return
                with receiver._lock:
                    receiver.spans.extend(decode(request))
                    receiver.requests += 1
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [span for span in self.spans if span.trace_id == trace_id]

    def wait_for(self, predicate: Any, timeout_s: float = 30.0) -> list[ReceivedSpan]:
        """Spans so far once ``predicate(spans)`` holds; AssertionError with what came after the timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                with self._lock:
                    refused = list(self.refused)
                raise AssertionError(
                    f"spans never matched in {timeout_s}s; received {len(spans)} in {self.requests} posts, "
                    f"refused {len(refused)} {refused[:3]}; by trace: {describe(spans)}"
                )
            time.sleep(0.2)


def describe(spans: list[ReceivedSpan]) -> str:
    """Each trace's spans as service:name counts, with each span's parent named: what a failed wait shows."""
    by_id = {span.span_id: span for span in spans}
    traces: dict[str, Counter[str]] = {}
    for span in spans:
        parent = by_id.get(span.parent_id)
        under = parent.name if parent else ("root" if not span.parent_id else f"missing {span.parent_id}")
        error = " ERROR" if span.status_code == 2 else ""
        traces.setdefault(span.trace_id, Counter())[f"{span.service}:{span.name}<{under}{error}"] += 1
    return "; ".join(f"{trace_id[:8]} {dict(counts)}" for trace_id, counts in traces.items())


def one_span(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    [found] = [span for span in spans if span.name == name]
    return found


@contextmanager
def tracing_to(receiver: OtlpReceiver, **options: Any) -> Iterator[None]:
    """This process traces into ``receiver`` through the real OTLP/HTTP exporter, every span sent as it ends."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from controlplane.core.observability import tracing

    exporter = OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
    tracing.tracing_configure(service_name="controlplane-test", exporter=exporter, batched=False, **options)
    try:
        yield
    finally:
        tracing.tracing_configure(service_name="", exporter=None)
