"""``/v1/responses`` batches through the official openai SDK, unchanged, against the running stack with tinylm:
the output lines parse as the SDK's own Response, a line cut at max_output_tokens is "incomplete", a body the
service refuses is a 400 line naming its field, a forced function call is a function_call item, and the tokens
reach the batch's usage and the tenant's completions usage report."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
from openai import OpenAI
from openai.types.responses import Response

from tests.e2e.test_sdk_generation import count
from tests.e2e.test_tool_calls import COUNT_TO
from tests.support.stack import assert_exactly_once, submit

pytestmark = pytest.mark.e2e
URL = "/v1/responses"
COUNT = {"type": "function", "name": "count", "parameters": COUNT_TO, "strict": True}


def _line(custom_id: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": URL, "body": {"model": "tinylm", "temperature": 0, **body}}


def test_responses_batch(e2e):
    key = e2e.new_tenant(f"responses-{time.time_ns()}")
    client = e2e.sdk(key)
    started = int(time.time()) - 1
    lines = [
        _line("string", {"input": "count from 3 to 8", "max_output_tokens": 20}),
        _line(
            "items",
            {
                "instructions": "count",
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "count from 5 to 9"}],
                    }
                ],
                "max_output_tokens": 20,
                "metadata": {"run": "e2e"},
            },
        ),
        _line("cut", {"input": "count from 1 to 40", "max_output_tokens": 16}),
        _line("stored", {"input": "count from 1 to 4", "store": True}),
        # A forced call, decoded under the call's grammar (tinylm's 256-token context holds one small function).
        _line(
            "call",
            {
                "input": "count from 2 to 5",
                "tools": [COUNT],
                "tool_choice": {"type": "function", "name": "count"},
                "max_output_tokens": 32,
            },
        ),
    ]
    batch = submit(client, lines, endpoint=URL)
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert [e["custom_id"] for e in errors] == ["stored"]
    assert (
        errors[0]["response"]["status_code"] == 400 and errors[0]["response"]["body"]["error"]["param"] == "body.store"
    )
    responses = {r["custom_id"]: Response.model_validate(r["response"]["body"]) for r in output}
    assert responses["string"].status == "completed" and responses["string"].output_text == count(3, 8)
    assert responses["items"].instructions == "count" and responses["items"].metadata == {"run": "e2e"}
    assert responses["items"].output[0].type == "message" and responses["items"].output[0].role == "assistant"
    cut = responses["cut"]
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 16
    [call] = responses["call"].output
    assert call.type == "function_call" and call.name == "count" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), COUNT["parameters"])
    # Usage: the batch's and the tenant's completions report hold the lines' tokens.
    input_tokens = sum(r.usage.input_tokens for r in responses.values())
    output_tokens = sum(r.usage.output_tokens for r in responses.values())
    assert (batch.usage.input_tokens, batch.usage.output_tokens) == (input_tokens, output_tokens)
    admin = OpenAI(base_url=e2e.base_url, api_key=key, admin_api_key=key, max_retries=0, timeout=60)
    page = admin.admin.organization.usage.completions(start_time=started, bucket_width="1d").to_dict()
    results = [r for bucket in page["data"] for r in bucket["results"]]
    assert sum(r["input_tokens"] for r in results) == input_tokens
    assert sum(r["output_tokens"] for r in results) == output_tokens
    assert sum(r["num_model_requests"] for r in results) == 4
