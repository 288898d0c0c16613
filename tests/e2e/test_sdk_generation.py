"""Text generation through the official openai SDK, unchanged, against the running stack: files.create →
batches.create with a generation endpoint → wait → output lines parsed as the SDK's own types. The worker
loads tinylm on the shared tritonserver on first use (TritonBackend.prepare)."""

from __future__ import annotations

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from tests.support.stack import assert_exactly_once, submit
from tests.support.structured_schema import SCHEMA

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
    assert tinylm.endpoints == ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    assert tinylm.context_length == 256


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "counting", "schema": schema, "strict": True}}


def test_structured_outputs_batch(e2e):
    """One batch mixing free text, json_object and json_schema lines (several seeds and temperatures) and a
    schema the decoding library cannot compile: that line is a 400 in the error file, the rest run, and what
    finished with "stop" parses (json_object) and validates (json_schema)."""
    import json

    import jsonschema

    client = e2e.sdk()
    chat = "/v1/chat/completions"
    lines = [_line("text", chat, {"messages": [{"role": "user", "content": "count from 3 to 8"}], "temperature": 0})]
    settings = [{"temperature": 0}, {"temperature": 0.8, "seed": 1}, {"temperature": 1.5, "seed": 2, "top_p": 0.9}]
    for i, sampling in enumerate(settings):
        question = {"messages": [{"role": "user", "content": f"count from {i + 2} to {i + 7} as json"}]}
        lines.append(_line(f"object-{i}", chat, {**question, **sampling, "response_format": {"type": "json_object"}}))
        body = {**question, **sampling, "n": 2, "max_tokens": 120, "response_format": _schema_format(SCHEMA)}
        lines.append(_line(f"schema-{i}", chat, body))
    bad = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": _schema_format({"not": {"type": "string"}}),
    }
    lines.append(_line("bad-schema", chat, bad))
    batch = submit(client, lines, endpoint=chat)
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert [e["custom_id"] for e in errors] == ["bad-schema"], errors
    error = errors[0]["response"]
    assert error["status_code"] == 400 and error["body"]["error"]["param"] == "body.response_format.json_schema.schema"
    completions = {r["custom_id"]: ChatCompletion.model_validate(r["response"]["body"]) for r in output}
    assert completions["text"].choices[0].message.content == count(3, 8)
    finished = 0
    for custom_id, completion in completions.items():
        for choice in completion.choices:
            if custom_id == "text" or choice.finish_reason != "stop":
                continue
            finished += 1
            document = json.loads(choice.message.content or "")
            if custom_id.startswith("object-"):
                assert isinstance(document, dict)
            else:
                jsonschema.validate(document, SCHEMA)
    assert finished >= 6  # of 9 structured choices: most close their document (else this tests nothing)
    # The model's own answer under json_object, greedy: what it learned for "as json".
    assert json.loads(completions["object-0"].choices[0].message.content or "") == {"numbers": [2, 3, 4, 5, 6, 7]}
