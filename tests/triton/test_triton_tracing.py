"""A Triton call inside a span: a client span, child of the caller's, with the call's W3C traceparent sent to
the server (core/observability/tracing.py, triton/client.py); exported by the real OTLP exporter to an in-test receiver."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from controlplane.core.observability import tracing
from controlplane.triton.client import TritonClient
from tests.support.otlp_receiver import OtlpReceiver, one_span, tracing_to


@pytest.fixture
def traced() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver().start()
    with tracing_to(receiver):
        yield receiver
    receiver.stop()


def test_triton_calls_are_children_of_their_shard_and_carry_traceparent(traced, identity: TritonClient):
    with tracing.span("shard.run") as shard:
        outputs = identity.infer("identity", {"INPUT0": np.ones((3, 2), np.float32)}, ["OUTPUT0"])
    assert outputs["OUTPUT0"].shape == (3, 2)
    trace_id = format(shard.get_span_context().trace_id, "032x")
    call = one_span(traced.trace(trace_id), "triton.infer")
    assert call.parent_id == format(shard.get_span_context().span_id, "016x")
    assert call.kind == 3  # SPAN_KIND_CLIENT
    assert call.attributes == {"model": "identity", "server": identity.url, "rows": 3}


def test_untraced_calls_send_no_headers(identity: TritonClient):
    assert not tracing.enabled()
    outputs = identity.infer("identity", {"INPUT0": np.ones((1, 2), np.float32)}, ["OUTPUT0"])
    assert outputs["OUTPUT0"].shape == (1, 2)
