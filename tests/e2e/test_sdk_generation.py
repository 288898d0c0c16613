"""Text generation through the official openai SDK, unchanged, against the running stack: files.create →
batches.create with a generation endpoint → wait → output lines parsed as the SDK's own types. The worker
loads tinylm on the shared tritonserver on first use (TritonBackend.prepare)."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from tests.e2e.helpers import assert_exactly_once, submit

pytestmark = pytest.mark.e2e


def count(a: int, b: int) -> str:
    return " ".join(str(n) for n in range(a, b + 1))


def _line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "tinylm", **body}}


def test_chat_completions_batch(e2e):
    client = e2e.sdk()
    # From 1: the tiny model's grammar is learned, not perfect; a greedy sweep of chats over 0..40 found one
    # miss, "count from 0 to 3" (it stops at 2). The test asserts the service, so it asks what the model knows.
    pairs = [(a, a + 3 + a % 7) for a in range(1, 21)]
    lines = [
        _line(
            f"chat-{a}", "/v1/chat/completions", {"messages": [{"role": "user", "content": f"count from {a} to {b}"}]}
        )
        for a, b in pairs
    ]
    for line in lines:
        line["body"] |= {"temperature": 0, "max_completion_tokens": 40}
    lines.append(_line("bad", "/v1/chat/completions", {"messages": [], "temperature": 0}))
    batch = submit(client, lines, endpoint="/v1/chat/completions")
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert [e["custom_id"] for e in errors] == ["bad"] and errors[0]["response"]["status_code"] == 400
    for record, (a, b) in zip(output, pairs, strict=True):
        completion = ChatCompletion.model_validate(record["response"]["body"])
        assert completion.choices[0].message.content == count(a, b)
        assert completion.choices[0].finish_reason == "stop" and completion.usage.completion_tokens == b - a + 2


def test_completions_batch(e2e):
    client = e2e.sdk()
    lines = [
        _line(f"cmpl-{a}", "/v1/completions", {"prompt": f"count from {a} to 30 :", "max_tokens": 4, "temperature": 0})
        for a in range(10)
    ]
    batch = submit(client, lines, endpoint="/v1/completions")
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert errors == []
    for a, record in enumerate(output):
        completion = Completion.model_validate(record["response"]["body"])
        assert completion.object == "text_completion" and completion.choices[0].text == count(a, a + 3)
        assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 4


def test_the_generation_model_is_listed(e2e):
    tinylm = e2e.sdk().models.retrieve("tinylm")
    assert tinylm.endpoints == ["/v1/chat/completions", "/v1/completions"] and tinylm.context_length == 256
