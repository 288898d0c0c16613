"""Function tools on ``/v1/responses`` lines: tools, tool_choice and a history of function_call /
function_call_output items mean what the equivalent chat line means (the same prompt, tools and choice, parsed by
the chat kind), errors name the Responses fields, and calls render as ``function_call`` output items that OpenAI's
schema and the SDK accept."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseFunctionToolCall

from controlplane.kinds.base import BodyIssue
from controlplane.kinds.generation.render import EngineChoice, EngineResult
from controlplane.kinds.generation.responses_render import render_response
from controlplane.kinds.registry import kind_for
from tests.contracts.openai_schema import validate
from tests.kinds.test_generation_tools import ASKED, TIME, USER, WEATHER, WEATHER_PARAMETERS, call, smollm2
from tests.kinds.test_responses_parse import valid_request

RESPONSES, CHAT = "/v1/responses", "/v1/chat/completions"
MODEL = "smollm2-135m-instruct"
# The same two functions in the Responses API's flat form.
R_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather now",
    "parameters": WEATHER_PARAMETERS,
    "strict": False,
}
R_TIME = {"type": "function", "name": "get_time", "parameters": None, "strict": None}


def responses_line(body: dict[str, Any], **model_changes: Any):
    valid_request(body)
    return kind_for(RESPONSES).parse_body(body, model=smollm2(**model_changes)).request


def chat_line(body: dict[str, Any], **model_changes: Any):
    return kind_for(CHAT).parse_body({"model": MODEL, **body}, model=smollm2(**model_changes)).request


def refusal(body: dict[str, Any]) -> BodyIssue:
    with pytest.raises(BodyIssue) as refused:
        kind_for(RESPONSES).parse_body({"model": MODEL, "input": "Weather in Paris?", **body}, model=smollm2())
    return refused.value


def same(a, b) -> bool:
    return (a.prompt_text, a.tools, a.tool_choice, a.parallel_tool_calls) == (
        b.prompt_text,
        b.tools,
        b.tool_choice,
        b.parallel_tool_calls,
    )


@pytest.mark.parametrize(
    ("tool_choice", "chat_choice"),
    [
        (None, None),
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        ({"type": "function", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}),
    ],
)
def test_tools_and_the_choice_mean_what_chats_mean(tool_choice, chat_choice):
    body = {"model": MODEL, "input": "Weather in Paris?", "tools": [R_WEATHER, R_TIME], "parallel_tool_calls": False}
    chat_body = {
        "messages": [USER | {"content": "Weather in Paris?"}],
        "tools": [WEATHER, TIME],
        "parallel_tool_calls": False,
    }
    if tool_choice is not None:
        body["tool_choice"], chat_body["tool_choice"] = tool_choice, chat_choice
    request = responses_line(body)
    assert request.tools and same(request, chat_line(chat_body))


def test_function_call_items_and_their_outputs_are_the_chat_history_of_calls():
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city":"Paris"}',
            "id": "fc_1",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
    ]
    request = responses_line({"model": MODEL, "input": items, "tools": [R_WEATHER]})
    history = [USER, ASKED, {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}]
    assert same(request, chat_line({"messages": history, "tools": [WEATHER]}))


def test_calls_after_an_assistant_message_are_one_turn_with_it():
    items = [
        {"role": "user", "content": "Weather in Paris and the time?"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": "noon"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21"},
    ]
    request = responses_line({"model": MODEL, "input": items, "tools": [R_WEATHER, R_TIME]})
    turn = {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [call("call_1"), call("call_2", "get_time", "{}")],
    }
    history = [
        {"role": "user", "content": "Weather in Paris and the time?"},
        turn,
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
        {"role": "tool", "tool_call_id": "call_1", "content": "21"},
    ]
    assert same(request, chat_line({"messages": history, "tools": [WEATHER, TIME]}))


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"tools": [{**R_WEATHER, "name": "get weather"}]}, "body.tools[0].name", "invalid_value"),
        (
            {"tools": [{**R_WEATHER, "parameters": {"type": "string"}}]},
            "body.tools[0].parameters",
            "invalid_function_parameters",
        ),
        ({"tools": [{**R_WEATHER, "defer_loading": True}]}, "body.tools[0].defer_loading", "unsupported_parameter"),
        ({"tools": [{**R_WEATHER, "function": {}}]}, "body.tools[0].function", "unknown_parameter"),
        ({"tools": [{"name": "f"}]}, "body.tools[0].type", "missing_required_parameter"),
        ({"tools": [R_WEATHER, R_WEATHER]}, "body.tools[1].name", "invalid_value"),
        (
            {"tools": [R_WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
            "body.tool_choice.name",
            "invalid_value",
        ),
        (
            {"tools": [R_WEATHER], "tool_choice": {"type": "function"}},
            "body.tool_choice.name",
            "missing_required_parameter",
        ),
        ({"tools": [R_WEATHER], "tool_choice": {"type": "file_search"}}, "body.tool_choice.type", "unsupported_value"),
        (
            {"tools": [R_WEATHER], "tool_choice": {"type": "function", "name": "get_weather", "x": 1}},
            "body.tool_choice.x",
            "unknown_parameter",
        ),
        ({"tools": [R_WEATHER], "tool_choice": "sometimes"}, "body.tool_choice", "invalid_value"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            "body.input[0].arguments",
            "missing_required_parameter",
        ),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "x": 1}]},
            "body.input[0].x",
            "unknown_parameter",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "body.input[0].call_id", "invalid_value"),
    ],
)
def test_a_bad_tool_field_names_the_responses_field(fields, param, code):
    issue = refusal(fields)
    assert (issue.param, issue.code) == (param, code), issue.message
    assert "function.name" not in issue.message and "messages" not in issue.message


def test_a_forced_call_needs_an_engine_that_constrains_decoding():
    with pytest.raises(BodyIssue) as refused:
        kind_for(RESPONSES).parse_body(
            {"model": MODEL, "input": "Weather?", "tools": [R_WEATHER], "tool_choice": "required"},
            model=smollm2(structured_outputs=False),
        )
    assert refused.value.param == "body.tool_choice"


def test_a_call_renders_as_a_function_call_item():
    request = responses_line(
        {"model": MODEL, "input": "Weather in Paris?", "tools": [R_WEATHER, R_TIME], "tool_choice": "required"}
    )
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    result = EngineResult(
        choices=(EngineChoice(text=text, finish_reason="stop", completion_tokens=12),),
        prompt_tokens=request.prompt_tokens,
    )
    body = render_response(request, result, request_id="rid1", created=1_800_000_000)
    validate(body, "Response")
    parsed = Response.model_validate(body)
    [item] = parsed.output  # a call alone: no message item
    assert isinstance(item, ResponseFunctionToolCall) and item.name == "get_weather"
    assert (
        item.arguments == '{"city":"Paris"}'
        and item.call_id.startswith("call_")
        and item.id == "fc_" + item.call_id[5:]
    )
    assert parsed.status == "completed" and parsed.tool_choice == "required"
    assert [tool.name for tool in parsed.tools] == ["get_weather", "get_time"]
    assert body["tools"][0] == R_WEATHER and body["tools"][1]["parameters"] is None
    # The same line rendered again (a retried shard) writes the same ids.
    assert render_response(request, result, request_id="rid1", created=1)["output"][0]["id"] == item.id


def test_a_named_choice_is_echoed_in_the_responses_form():
    body = {
        "model": MODEL,
        "input": "Weather?",
        "tools": [R_WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    request = responses_line(body)
    text = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    result = EngineResult(
        choices=(EngineChoice(text=text, finish_reason="stop", completion_tokens=9),),
        prompt_tokens=request.prompt_tokens,
    )
    rendered = render_response(request, result, request_id="rid2", created=1_800_000_000)
    validate(rendered, "Response")
    assert rendered["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_the_shipped_example_file_parses_line_by_line():
    from pathlib import Path

    import orjson

    path = Path(__file__).resolve().parents[2] / "examples" / "responses.jsonl"
    for line in path.read_text().splitlines():
        record = orjson.loads(line)
        assert record["url"] == RESPONSES and record["body"]["model"] == MODEL
        valid_request(record["body"])
        assert kind_for(RESPONSES).parse_body(record["body"], model=smollm2()).units >= 1
