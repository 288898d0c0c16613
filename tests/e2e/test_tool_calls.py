"""Tool calling end to end: chat batches with ``tools`` through the official openai SDK, run by the continuous-
batching engine on the shared tritonserver, on tinylm and on SmolLM2-135M-Instruct. A forced choice ("required",
a named function) is decoded under the call's grammar, so every such answer is a call whose arguments
json-parse and validate against the function's parameters; an "auto" answer is a valid message either way."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types.chat import ChatCompletion

from tests.contracts.openai_schema import validate
from tests.support.stack import assert_exactly_once, submit

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
# Small, for tinylm's 256-token context: with the list in the prompt, "count from 1 to 3" is 223 tokens.
COUNT_TO = {"type": "object", "properties": {"to": {"type": "integer", "maximum": 20}}, "required": ["to"]}
WEATHER_IN = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_IN = {"type": "object", "properties": {}, "additionalProperties": False}
PARAMETERS = {"count": COUNT_TO, "get_weather": WEATHER_IN, "get_time": TIME_IN}


def _tool(name: str, description: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": PARAMETERS[name]}}


def _named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def _line(custom_id: str, model: str, question: str, tools: list[dict], **body) -> dict:
    messages = [{"role": "user", "content": question}]
    body = {"model": model, "messages": messages, "tools": tools, "temperature": 0, **body}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def _answers(e2e, lines: list[dict]) -> dict[str, ChatCompletion]:
    client = e2e.sdk()
    batch = e2e.wait_status(client, submit(client, lines, endpoint=CHAT).id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    output, errors = assert_exactly_once(client, batch, lines)
    assert errors == []
    answers = {}
    for record in output:
        validate(record["response"]["body"], "CreateChatCompletionResponse")  # OpenAI's schema, strictly
        answers[record["custom_id"]] = ChatCompletion.model_validate(record["response"]["body"])
    return answers


def _calls(completion: ChatCompletion, allowed: set[str]) -> list[tuple[str, dict]]:
    """Every choice's calls, each checked: a listed function, arguments that parse and validate."""
    found = []
    for choice in completion.choices:
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and choice.message.tool_calls
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
            assert call.function.name in allowed
            arguments = json.loads(call.function.arguments)
            jsonschema.validate(arguments, PARAMETERS[call.function.name])
            found.append((call.function.name, arguments))
    return found


def test_forced_calls_on_tinylm(e2e):
    # tinylm's context is 256 tokens: one small function; its call is ~30 tokens.
    tools = [{"type": "function", "function": {"name": "count", "parameters": COUNT_TO}}]
    lines = [
        _line("required", "tinylm", "count from 1 to 3", tools, tool_choice="required", max_tokens=32),
        _line("named", "tinylm", "count from 2 to 5", tools, tool_choice=_named("count"), max_tokens=32),
        _line("sampled", "tinylm", "count", tools, tool_choice="required", n=2, temperature=1, seed=7, max_tokens=32),
    ]
    answers = _answers(e2e, lines)
    for custom_id in ("required", "named", "sampled"):
        calls = _calls(answers[custom_id], {"count"})
        assert len(calls) == len(answers[custom_id].choices)
    ids = [c.id for a in answers.values() for choice in a.choices for c in choice.message.tool_calls or ()]
    assert len(set(ids)) == len(ids) == 4


def test_forced_and_automatic_calls_on_smollm2(e2e):
    model = "smollm2-135m-instruct"
    tools = [_tool("get_weather", "The weather in a city now"), _tool("get_time", "The time now")]
    question = "What is the weather in Paris, in C?"
    lines = [
        _line("required", model, question, tools, tool_choice="required", max_tokens=40),
        _line("named", model, question, tools, tool_choice=_named("get_weather"), max_tokens=40),
        _line("time", model, "What time is it?", tools, tool_choice=_named("get_time"), max_tokens=16),
        _line("auto", model, question, tools, max_tokens=48),
    ]
    answers = _answers(e2e, lines)
    assert len(_calls(answers["required"], {"get_weather", "get_time"})) == 1  # one call per choice
    [(_, arguments)] = _calls(answers["named"], {"get_weather"})
    assert "Paris" in arguments["city"]
    assert _calls(answers["time"], {"get_time"}) == [("get_time", {})]
    # auto: the model decides; whatever it wrote is a valid answer (calls that validate, or text).
    auto = answers["auto"].choices[0]
    if auto.message.tool_calls:
        _calls(answers["auto"], {"get_weather", "get_time"})
    else:
        assert auto.finish_reason in {"stop", "length"} and auto.message.content
    for completion in answers.values():
        assert completion.usage.prompt_tokens > 0 and completion.usage.completion_tokens > 0
