"""LoRA adapters through the official openai SDK against the running stack: tinylm's two adapters are listed by
models.list(), one batch whose lines name `tinylm`, `tinylm:double` and `tinylm:reverse` runs on the one tinylm
engine with each line answered in its adapter's way, and the tenant's usage report shows tokens per adapter."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion

from tests.support.stack import assert_exactly_once, submit

pytestmark = pytest.mark.e2e

ANSWERS = {
    "tinylm": lambda a, b: " ".join(str(n) for n in range(a, b + 1)),
    "tinylm:double": lambda a, b: " ".join(f"{n} {n}" for n in range(a, b + 1)),
    "tinylm:reverse": lambda a, b: " ".join(str(n) for n in range(b, a - 1, -1)),
}


def test_a_batch_of_the_base_and_two_adapters_through_the_sdk(e2e):
    key = e2e.new_tenant(f"lora-{time.time_ns()}")
    client = e2e.sdk(key)
    listed = {m.id: m for m in client.models.list()}
    assert listed["tinylm:double"].model_extra["parent"] == "tinylm" and "tinylm:reverse" in listed

    started = int(time.time()) - 1
    pairs = [(1, 4), (2, 5), (3, 6), (0, 2)]
    lines = []
    for a, b in pairs:
        for model in ANSWERS:
            body = {"model": model, "messages": [{"role": "user", "content": f"count from {a} to {b}"}]}
            lines.append(
                {
                    "custom_id": f"{model}/{a}-{b}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body | {"temperature": 0, "max_completion_tokens": 30},
                }
            )
    batch = submit(client, lines, endpoint="/v1/chat/completions")
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert errors == []
    tokens: dict[str, int] = dict.fromkeys(ANSWERS, 0)
    for record in output:
        model, span = record["custom_id"].split("/")
        a, b = map(int, span.split("-"))
        completion = ChatCompletion.model_validate(record["response"]["body"])
        assert completion.model == model
        assert completion.choices[0].message.content == ANSWERS[model](a, b), record["custom_id"]
        tokens[model] += completion.usage.prompt_tokens

    admin = OpenAI(base_url=e2e.base_url, api_key=key, admin_api_key=key, max_retries=0, timeout=60)
    page = admin.admin.organization.usage.completions(start_time=started, bucket_width="1d", group_by=["model"])
    results = [r for bucket in page.to_dict()["data"] for r in bucket["results"]]
    assert {r["model"]: r["input_tokens"] for r in results} == tokens
