"""A generation stream that breaks before (or while) its requests are sent: every request gets an answer at
once, never silence. The chaos suite found a shard of a Triton killed mid-generation waiting out
TRITON_TIMEOUT_SECONDS (120 s) with 22 lines "in flight": its stream had failed to connect to the
restarting server before the lines were submitted, so the failure reached no request and nothing answered
them. No tritonserver here: a port nothing listens on is the server that went away."""

from __future__ import annotations

import time

import pytest

from controlplane.triton.errors import TransientTritonError
from controlplane.triton.streaming import GenerationRequest, GenerationResponse, GenerationStream
from deploy.local.triton_server import free_port

REQUEST = GenerationRequest("1", "count from 1 to 3", {"max_tokens": 4})


def _broken_stream(received: list[GenerationResponse]) -> GenerationStream:
    stream = GenerationStream(f"127.0.0.1:{free_port()}", "tinylm", on_response=received.append)
    # Connection refused ends the call at once; its reader thread ends with it.
    stream._reader.join(timeout=20)
    assert not stream._reader.is_alive(), "the call to a closed port did not end"
    return stream


def test_a_request_submitted_on_a_stream_that_already_broke_fails_at_once():
    received: list[GenerationResponse] = []
    stream = _broken_stream(received)
    started = time.monotonic()
    with pytest.raises(TransientTritonError):
        stream.submit(REQUEST)
    assert time.monotonic() - started < 1.0
    assert stream.in_flight == 0 and received == []
    stream.close(cancel=True)


def test_responses_of_a_broken_stream_do_not_wait_for_the_silence_limit():
    stream = GenerationStream(f"127.0.0.1:{free_port()}", "tinylm")
    stream._reader.join(timeout=20)
    started = time.monotonic()
    with pytest.raises(TransientTritonError):
        stream.submit(REQUEST)
        list(stream.responses(timeout_s=30))
    assert time.monotonic() - started < 1.0
    stream.close(cancel=True)
