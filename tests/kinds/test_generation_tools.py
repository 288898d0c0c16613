"""Tool calling at validation (kinds/generation/tools.py, messages.py): ``tools``, ``tool_choice``,
``parallel_tool_calls`` and a history with calls read into the GenerationRequest, every bad one a 400 line naming
the field under ``body``; and the grammar a forced call is decoded under, as the engine's wire sends it."""

from __future__ import annotations

import json
from typing import Any

import llguidance
import pytest
from jsonschema import Draft202012Validator

from controlplane.fleet.catalogue.seed import SEED
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import BodyIssue, LineOutput
from controlplane.kinds.generation.columns import generation_columns_decode, generation_columns_encode
from controlplane.kinds.generation.schema import schema_compile_problem
from controlplane.kinds.generation.tools import FunctionTool, ToolChoice, tool_call_schema
from controlplane.kinds.registry import kind_for
from tests.kinds.test_generation_kind import CHAT, parsed_lines, run

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
    "required": ["city"],
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The weather now", "parameters": WEATHER_PARAMETERS},
}
TIME = {"type": "function", "function": {"name": "get_time"}}  # no parameters: takes none


def smollm2(**changes: Any) -> CatalogueModel:
    """The shipped catalogue entry, unsaved (its tokenizer is converted by make install)."""
    return CatalogueModel(**{**next(e for e in SEED if e["name"] == "smollm2-135m-instruct"), **changes})


def body(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    conversation = list(messages) or [{"role": "user", "content": "What is the weather in Paris?"}]
    return {"model": "smollm2-135m-instruct", "messages": conversation, "tools": [WEATHER, TIME], **fields}


def parse(line: dict[str, Any], **model_changes: Any):
    return kind_for(CHAT).parse_body(line, model=smollm2(**model_changes)).request


def refusal(line: dict[str, Any], **model_changes: Any) -> BodyIssue:
    with pytest.raises(BodyIssue) as refused:
        parse(line, **model_changes)
    return refused.value


def call(call_id: str, name: str = "get_weather", arguments: str = '{"city":"Paris"}') -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


USER = {"role": "user", "content": "Weather in Paris?"}
ASKED = {"role": "assistant", "content": None, "tool_calls": [call("call_1")]}


def with_tool(index: int, **function: Any) -> list[dict[str, Any]]:
    tools = [WEATHER, TIME]
    tools[index] = {"type": "function", "function": {**tools[index]["function"], **function}}
    return tools


def test_tools_and_the_choice_are_read_into_the_request():
    request = parse(body(tool_choice={"type": "function", "function": {"name": "get_time"}}, parallel_tool_calls=False))
    weather, time = request.tools
    assert (weather.name, weather.description, time.name, time.parameters) == (
        "get_weather",
        "The weather now",
        "get_time",
        None,
    )
    assert json.loads(weather.parameters) == WEATHER_PARAMETERS
    assert list(json.loads(weather.parameters)["properties"]) == ["city", "unit"]  # the author's order
    assert request.tool_choice == ToolChoice("function", "get_time") and request.parallel_tool_calls is False
    defaults = parse(body())
    assert defaults.tool_choice == ToolChoice("auto") and defaults.parallel_tool_calls is True  # OpenAI's defaults
    assert parse(body(tools=None)).tool_choice == ToolChoice("none")
    assert parse(body(tool_choice="none")).tool_choice.forced is False
    assert parse(body(tool_choice="required")).tool_choice == ToolChoice("required")


REFUSALS = [
    ({"tools": {"type": "function"}}, "body.tools", "invalid_type", "expected an array"),
    ({"tools": []}, "body.tools", "empty_array", "empty array"),
    ({"tools": [WEATHER] * 129}, "body.tools", "array_above_max_length", "128"),
    ({"tools": [WEATHER, "get_time"]}, "body.tools[1]", "invalid_type", "an object"),
    ({"tools": [{"function": WEATHER["function"]}]}, "body.tools[0].type", "missing_required_parameter", "type"),
    ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "body.tools[0].type", "unsupported_value", "Custom"),
    ({"tools": [{"type": "retrieval"}]}, "body.tools[0].type", "invalid_value", "'function'"),
    ({"tools": [{**WEATHER, "extra": 1}]}, "body.tools[0].extra", "unknown_parameter", "extra"),
    ({"tools": [{"type": "function"}]}, "body.tools[0].function", "missing_required_parameter", "function"),
    ({"tools": with_tool(1, name="get time")}, "body.tools[1].function.name", "invalid_value", "^[a-zA-Z0-9_-]"),
    ({"tools": with_tool(1, name="f" * 65)}, "body.tools[1].function.name", "invalid_value", "{1,64}"),
    ({"tools": with_tool(1, name=None)}, "body.tools[1].function.name", "missing_required_parameter", "name"),
    ({"tools": with_tool(1, name="get_weather")}, "body.tools[1].function.name", "invalid_value", "Duplicate"),
    ({"tools": with_tool(0, description=5)}, "body.tools[0].function.description", "invalid_type", "a string"),
    ({"tools": with_tool(0, strict="yes")}, "body.tools[0].function.strict", "invalid_type", "a boolean"),
    ({"tools": with_tool(0, returns="x")}, "body.tools[0].function.returns", "unknown_parameter", "returns"),
    ({"tools": with_tool(1, parameters=["x"])}, "body.tools[1].function.parameters", "invalid_type", "JSON Schema"),
    (
        {"tools": with_tool(1, parameters={"type": "objekt"})},
        "body.tools[1].function.parameters",
        "invalid_function_parameters",
        "'get_time'",
    ),
    (
        {"tools": with_tool(0, parameters={"type": "string"})},
        "body.tools[0].function.parameters",
        "invalid_function_parameters",
        "must describe an object",
    ),
    (  # valid Draft 2020-12, but the decoding library compiles no look-behind
        {"tools": with_tool(1, parameters={"type": "object", "properties": {"a": {"pattern": "(?<=a)b"}}})},
        "body.tools[1].function.parameters",
        "invalid_function_parameters",
        "look-around",
    ),
    ({"tool_choice": "sometimes"}, "body.tool_choice", "invalid_value", "'required'"),
    ({"tool_choice": 1}, "body.tool_choice", "invalid_type", "a string or an object"),
    ({"tool_choice": "auto", "tools": None}, "body.tool_choice", "invalid_value", "only allowed when 'tools'"),
    (
        {"tool_choice": {"type": "function", "function": {"name": "get_news"}}},
        "body.tool_choice.function.name",
        "invalid_value",
        '"get_news" is not one of the functions',
    ),
    ({"tool_choice": {"type": "function"}}, "body.tool_choice.function", "missing_required_parameter", "function"),
    ({"tool_choice": {"type": "allowed_tools"}}, "body.tool_choice.type", "unsupported_value", "allowed_tools"),
    ({"tool_choice": {"type": "tool"}}, "body.tool_choice.type", "invalid_value", "'function'"),
    ({"parallel_tool_calls": "yes"}, "body.parallel_tool_calls", "invalid_type", "a boolean"),
    ({"functions": [WEATHER["function"]]}, "body.functions", "unsupported_parameter", "functions"),  # legacy
]


@pytest.mark.parametrize(("fields", "param", "code", "says"), REFUSALS, ids=[r[1] + ":" + r[2] for r in REFUSALS])
def test_a_bad_tool_field_is_a_400_line_naming_it(fields, param, code, says):
    issue = refusal(body(**fields))
    assert (issue.param, issue.code) == (param, code), issue.message
    assert says in issue.message


HISTORY_REFUSALS = [
    ([USER, {"role": "tool", "content": "20C", "tool_call_id": "call_1"}], "body.messages[1].tool_call_id", "invalid_value"),
    ([USER, ASKED, {"role": "tool", "content": "20C", "tool_call_id": "call_9"}], "body.messages[2].tool_call_id", "invalid_value"),
    ([USER, ASKED, {"role": "tool", "content": "20C"}], "body.messages[2].tool_call_id", "missing_required_parameter"),
    ([USER, ASKED, {"role": "tool", "tool_call_id": "call_1"}], "body.messages[2].content", "missing_required_parameter"),
    ([USER, ASKED, {"role": "tool", "content": "x", "tool_call_id": "call_1", "name": "f"}], "body.messages[2].name", "unknown_parameter"),
    ([USER, {"role": "function", "content": "x", "name": "f"}], "body.messages[1].role", "unsupported_value"),
    ([USER, {"role": "assistant", "content": None}], "body.messages[1].content", "missing_required_parameter"),
    ([USER, {"role": "assistant", "tool_calls": []}], "body.messages[1].tool_calls", "empty_array"),
    ([USER, {"role": "assistant", "tool_calls": {"id": "c"}}], "body.messages[1].tool_calls", "invalid_type"),
    ([USER, {"role": "assistant", "tool_calls": [{**call("c"), "type": "custom"}]}], "body.messages[1].tool_calls[0].type", "invalid_value"),
    ([USER, {"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}], "body.messages[1].tool_calls[0].id", "missing_required_parameter"),
    ([USER, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function"}]}], "body.messages[1].tool_calls[0].function", "missing_required_parameter"),
    ([USER, {"role": "assistant", "tool_calls": [call("c", arguments={"city": "Paris"})]}], "body.messages[1].tool_calls[0].function.arguments", "invalid_type"),
    ([USER, {"role": "assistant", "tool_calls": [{**call("c"), "function": {"name": "f", "arguments": "{}", "x": 1}}]}], "body.messages[1].tool_calls[0].function.x", "unknown_parameter"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "param", "code"), HISTORY_REFUSALS, ids=[r[1] + ":" + r[2] for r in HISTORY_REFUSALS]
)
def test_a_bad_history_of_calls_is_a_400_line_naming_the_message(messages, param, code):
    issue = refusal(body(*messages))
    assert (issue.param, issue.code) == (param, code), issue.message


def test_a_tool_message_answers_a_call_of_any_earlier_assistant_message():
    second = {"role": "assistant", "content": "And the time.", "tool_calls": [call("call_2", "get_time", "{}")]}
    request = parse(
        body(
            USER,
            ASKED,
            {"role": "tool", "content": "20C", "tool_call_id": "call_1"},
            second,
            {"role": "tool", "content": [{"type": "text", "text": "noon"}], "tool_call_id": "call_2"},
            {"role": "tool", "content": "again", "tool_call_id": "call_1"},
        )
    )
    assert request.prompt_tokens > 0


def test_a_forced_call_needs_an_engine_that_constrains_decoding():
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        issue = refusal(body(tool_choice=choice), structured_outputs=False)
        assert (issue.param, issue.code) == ("body.tool_choice", "unsupported_value")
        assert "no constrained decoding" in issue.message
    assert parse(body(tool_choice="auto"), structured_outputs=False).tools  # auto decodes freely


# --- the grammar of a forced call ---------------------------------------------------------------------------------


def _tools(*tools: dict[str, Any]) -> tuple[FunctionTool, ...]:
    return parse(body(tools=list(tools))).tools


def test_a_named_function_is_decoded_as_its_call_object():
    schema = tool_call_schema(_tools(WEATHER, TIME), ToolChoice("function", "get_weather"))
    assert schema == {
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "arguments": {**WEATHER_PARAMETERS, "additionalProperties": False},  # closed in the grammar
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
    validator = Draft202012Validator(schema)
    assert validator.is_valid({"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}})
    assert not validator.is_valid({"name": "get_time", "arguments": {}})
    assert not validator.is_valid({"name": "get_weather", "arguments": {"unit": "C"}})  # city is required


def test_required_is_any_one_call_and_a_function_without_parameters_takes_none():
    schema = tool_call_schema(_tools(WEATHER, TIME), ToolChoice("required"))
    validator = Draft202012Validator(schema)
    assert len(schema["anyOf"]) == 2
    assert validator.is_valid({"name": "get_time", "arguments": {}})
    assert not validator.is_valid({"name": "get_time", "arguments": {"zone": "UTC"}})
    assert validator.is_valid({"name": "get_weather", "arguments": {"city": "Oslo"}})
    assert not validator.is_valid([{"name": "get_time", "arguments": {}}])  # one call, not a list
    assert tool_call_schema(_tools(WEATHER), ToolChoice("auto")) is None
    assert tool_call_schema(_tools(WEATHER), ToolChoice("none")) is None


def test_local_references_in_parameters_point_into_the_call_schema():
    defs = {
        "type": "object",
        "properties": {"place": {"$ref": "#/$defs/place"}},
        "required": ["place"],
        "$defs": {"place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    }
    tools = _tools(
        {"type": "function", "function": {"name": "at", "parameters": defs}},
        {"type": "function", "function": {"name": "near", "parameters": defs}},
    )
    for choice in (ToolChoice("required"), ToolChoice("function", "near")):
        schema = tool_call_schema(tools, choice)
        text = json.dumps(schema)
        assert schema_compile_problem(text) == ""
        validator = Draft202012Validator(schema)
        assert validator.is_valid({"name": "near", "arguments": {"place": {"city": "Oslo"}}})
        assert not validator.is_valid({"name": "near", "arguments": {"place": {"town": "Oslo"}}})
    # Unrebased, the same reference is one the decoding library cannot resolve.
    unrebased = {"type": "object", "properties": {"name": {"const": "at"}, "arguments": defs}}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(unrebased))
    assert "does not exist" in str(llguidance.LLMatcher.validate_grammar(grammar))


def test_objects_that_list_their_properties_are_closed_in_the_grammar_unless_they_say_otherwise():
    parameters = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},  # a property of that name
            "tags": {"type": "object", "additionalProperties": {"type": "string"}},
            "open": {"type": "object", "properties": {"a": {}}, "additionalProperties": True},
            "both": {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]},
            "items": {"type": "array", "items": {"properties": {"x": {"const": {"properties": {}}}}}},
        },
    }
    [tool] = _tools({"type": "function", "function": {"name": "f", "parameters": parameters}})
    arguments = tool_call_schema((tool,), ToolChoice("required"))["properties"]["arguments"]
    inner = arguments["properties"]
    assert arguments["additionalProperties"] is False
    assert (
        inner["properties"]["additionalProperties"] is False
        and "additionalProperties" not in inner["properties"]["properties"]
    )
    assert inner["tags"]["additionalProperties"] == {"type": "string"} and inner["open"]["additionalProperties"] is True
    assert all("additionalProperties" not in branch for branch in inner["both"]["allOf"])  # each lists only some
    assert inner["items"]["items"]["additionalProperties"] is False
    assert inner["items"]["items"]["properties"]["x"] == {"const": {"properties": {}}}  # data, not a schema
    assert json.loads(tool.parameters) == parameters  # the arguments are checked against the schema as written


def test_the_engine_gets_the_call_grammar_as_guided_decoding_in_place_of_response_format():
    person = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}
    small = [TIME, {"type": "function", "function": {"name": "n", "parameters": {"type": "object"}}}]  # tinylm: 256
    lines = [
        body(tool_choice="required"),
        body(tool_choice={"type": "function", "function": {"name": "get_time"}}, response_format=person),
        body(tool_choice="auto"),
        body(tool_choice="none", response_format=person),
    ]
    for line in lines:
        line |= {"model": "tinylm", "messages": [{"role": "user", "content": "count"}], "tools": small, "max_tokens": 8}
    _, control, engine = run(CHAT, lines)
    assert sorted(control.finished) == [1, 2, 3, 4]
    assert all(isinstance(outcome, LineOutput) for outcome in control.finished.values())
    guided = [request.sampling_parameters.get("guided_decoding") for request in engine.submitted]  # in line order
    assert json.loads(guided[0]) == {"json": tool_call_schema(_tools(*small), ToolChoice("required"))}
    assert json.loads(guided[1])["json"]["properties"]["name"] == {"const": "get_time"}
    assert guided[2] is None  # auto: free text, read by the parser
    assert json.loads(guided[3]) == {"json": {"type": "object"}}


def test_shard_columns_keep_the_tools_and_the_choice():
    lines = parsed_lines(CHAT, [body(tool_choice="required", parallel_tool_calls=False), body()], smollm2())
    _, decoded = generation_columns_decode(generation_columns_encode("smollm2-135m-instruct", list(lines.items())))
    assert [decoded[n].request.request for n in (1, 2)] == [lines[n].request.request for n in (1, 2)]
    assert decoded[1].request.request.tool_choice == ToolChoice("required")
