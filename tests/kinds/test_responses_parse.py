"""``/v1/responses`` bodies: the translation of input items, instructions and text.format into the chat request
they mean (the same prompt, sampling and format as the equivalent chat body), every CreateResponse field
classified, each refusal a 400 naming the Responses field, and every accepted body a valid OpenAI request."""

from __future__ import annotations

import json

import pytest

from controlplane.kinds.generation.bodies import parse_chat_body
from controlplane.kinds.generation.fields import BodyError
from controlplane.kinds.generation.responses import (
    RESPONSES_HONOURED,
    RESPONSES_NOT_HONOURED,
    ResponseEcho,
    ResponsesRequest,
    parse_responses_body,
)
from tests.contracts.openai_schema import schema_errors, validate
from tests.kinds.conftest import CONTEXT
from tests.kinds.test_generation_spec_fields import spec_properties
from tests.support.structured_schema import SCHEMA

VALID = {"model": "tiny", "input": "count from 3 to 5"}


def responses(tokenizer, context=CONTEXT, **fields):
    body = {**VALID, **fields}
    request = parse_responses_body(body, tokenizer=tokenizer, context_length=context)
    valid_request(body)
    return request


def valid_request(body):
    """What the parser accepts, OpenAI's spec accepts too. Input items one by one against the kinds InputItem
    lists: a ``"type": "message"`` item is both an EasyInputMessage and an Item, which the spec tells apart by
    a discriminator that JSON Schema's oneOf does not read."""
    validate({**body, "input": "x"}, "CreateResponse")
    for item in body["input"] if isinstance(body["input"], list) else ():
        assert not schema_errors(item, "EasyInputMessage") or not schema_errors(item, "Item"), item


def chat(tokenizer, messages, **fields):
    body = {"model": "tiny", "messages": messages, **fields}
    return parse_chat_body(body, tokenizer=tokenizer, context_length=CONTEXT)


def refused(tokenizer, context=CONTEXT, **fields):
    with pytest.raises(BodyError) as caught:
        parse_responses_body({**VALID, **fields}, tokenizer=tokenizer, context_length=context)
    return caught.value


def same_prompt(a, b):
    return a.prompt_text == b.prompt_text and a.prompt_token_ids == b.prompt_token_ids


def test_a_string_input_is_one_user_message(tokenizer):
    request = responses(tokenizer)
    assert isinstance(request, ResponsesRequest) and request.kind == "chat" and request.n == 1
    assert same_prompt(request, chat(tokenizer, [{"role": "user", "content": "count from 3 to 5"}]))
    assert request.prompt_text == "<user> count from 3 to 5\n<assistant>"
    assert request.echo == ResponseEcho()


def test_instructions_are_a_system_message_ahead_of_the_input_items(tokenizer):
    items = [
        {"role": "developer", "content": "answer in digits"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "count"}, {"type": "input_text", "text": "from 3"}],
        },
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "3 4", "annotations": [], "logprobs": []}],
        },
        {"role": "user", "content": "go on"},
    ]
    request = responses(tokenizer, instructions="be brief", input=items)
    expected = chat(
        tokenizer,
        [
            {"role": "system", "content": "be brief"},
            {"role": "developer", "content": "answer in digits"},
            {"role": "user", "content": "count\nfrom 3"},
            {"role": "assistant", "content": "3 4"},
            {"role": "user", "content": "go on"},
        ],
    )
    assert same_prompt(request, expected)
    assert request.prompt_text.startswith("<system> be brief\n<system> answer in digits\n<user> count\nfrom 3\n")
    assert request.echo.instructions == "be brief"


def test_the_honoured_fields_reach_the_request_and_the_echo(tokenizer):
    request = responses(
        tokenizer,
        max_output_tokens=20,
        temperature=0.5,
        top_p=0.9,
        metadata={"team": "a"},
        user="u-1",
        safety_identifier="s-1",
        prompt_cache_key="k",
        parallel_tool_calls=False,
        tool_choice="none",
        tools=[],
        store=False,
        background=False,
        truncation="disabled",
        service_tier="auto",
        include=[],
        top_logprobs=0,
    )
    assert (request.max_tokens, request.temperature, request.top_p) == (20, 0.5, 0.9)
    assert request.metadata == (("team", "a"),) and request.user == "u-1" and request.parallel_tool_calls is False
    assert request.tools == ()
    assert request.echo == ResponseEcho(
        max_output_tokens=20,
        tool_choice="none",
        safety_identifier="s-1",
        prompt_cache_key="k",
    )


def test_include_asks_for_logprobs_and_top_logprobs_sets_the_alternatives(tokenizer):
    request = responses(tokenizer, include=["message.output_text.logprobs"], top_logprobs=3)
    assert (request.logprobs, request.top_logprobs, request.echo.top_logprobs) == (True, 3, 3)
    # Without include, OpenAI returns none: top_logprobs is echoed and changes nothing else.
    request = responses(tokenizer, top_logprobs=3)
    assert (request.logprobs, request.top_logprobs, request.echo.top_logprobs) == (False, 0, 3)
    assert responses(tokenizer, include=[]).logprobs is False


def test_without_max_output_tokens_the_line_may_use_what_the_context_leaves(tokenizer):
    request = responses(tokenizer)
    assert request.max_tokens == CONTEXT - request.prompt_tokens and request.echo.max_output_tokens is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ({"format": {"type": "text"}}, {"type": "text"}),
        ({"format": {"type": "json_object"}}, {"type": "json_object"}),
        (
            {"format": {"type": "json_schema", "name": "counting", "schema": SCHEMA, "strict": True}},
            {"type": "json_schema", "json_schema": {"name": "counting", "schema": SCHEMA, "strict": True}},
        ),
    ],
)
def test_text_format_is_chats_response_format(tokenizer, text, expected):
    request = responses(tokenizer, input="count from 3 to 5 as json", text=text)
    expected_request = chat(tokenizer, [{"role": "user", "content": "as json"}], response_format=expected)
    assert request.response_format == expected_request.response_format


def test_a_json_schema_format_keeps_its_description_for_the_echo(tokenizer):
    text = {"format": {"type": "json_schema", "name": "c", "schema": SCHEMA, "description": "numbers"}}
    request = responses(tokenizer, text=text)
    assert request.response_format.schema == json.dumps(SCHEMA) and request.echo.format_description == "numbers"


def test_every_spec_field_is_classified_and_nothing_else():
    assert not RESPONSES_HONOURED & set(RESPONSES_NOT_HONOURED)
    assert spec_properties("CreateResponse") == RESPONSES_HONOURED | set(RESPONSES_NOT_HONOURED)


@pytest.mark.parametrize(("name", "neutral"), sorted(RESPONSES_NOT_HONOURED.items()))
def test_a_field_not_honoured_is_refused_unless_unused(tokenizer, name, neutral):
    for value in (None, *neutral):
        parse_responses_body({**VALID, name: value}, tokenizer=tokenizer, context_length=CONTEXT)
    error = refused(tokenizer, **{name: {"some": "setting"}})
    assert error.param == name
    assert error.code == ("unsupported_value" if neutral else "unsupported_parameter")


@pytest.mark.parametrize(
    ("fields", "param", "code", "words"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter", "no stored responses"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter", "no stored conversations"),
        ({"store": True}, "store", "unsupported_value", "not stored"),
        ({"background": True}, "background", "unsupported_value", "background"),
        ({"stream": True}, "stream", "unsupported_value", "whole response"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_value", "do not reason"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "unsupported_parameter", "stored prompts"),
        ({"include": ["reasoning.encrypted_content"]}, "include[0]", "unsupported_value", "only output data"),
        ({"include": "message.output_text.logprobs"}, "include", "invalid_type", "an array"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value", "only allowed when 'tools' are specified"),
        ({"truncation": "auto"}, "truncation", "unsupported_value", "not supported"),
        ({"top_logprobs": 21}, "top_logprobs", "integer_above_max_value", "<= 20"),
        ({"n": 2}, "n", "unknown_parameter", "Unrecognized"),
        ({"messages": []}, "messages", "unknown_parameter", "Unrecognized"),
        ({"max_completion_tokens": 20}, "max_completion_tokens", "unknown_parameter", "Unrecognized"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_value", "built-in tools"),
        ({"tools": {"type": "web_search"}}, "tools", "invalid_type", "an array"),
        ({"instructions": ["x"]}, "instructions", "invalid_type", "a string"),
        ({"input": None}, "input", "missing_required_parameter", "input"),
        ({"input": []}, "input", "empty_array", "empty array"),
        ({"input": 3}, "input", "invalid_type", "a string or an array"),
        ({"input": ["hi"]}, "input[0]", "invalid_type", "an object"),
        ({"input": [{"content": "hi"}]}, "input[0].role", "missing_required_parameter", "role"),
        ({"input": [{"role": "tool", "content": "hi"}]}, "input[0].role", "invalid_value", "'developer'"),
        ({"input": [{"role": "user"}]}, "input[0].content", "missing_required_parameter", "content"),
        ({"input": [{"role": "user", "content": "x", "name": "a"}]}, "input[0].name", "unknown_parameter", "name"),
        ({"input": [{"role": "user", "content": "x", "status": "done"}]}, "input[0].status", "invalid_value", "done"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_value", "no stored"),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
            "input[0].call_id",
            "invalid_value",
            "answers no function_call item",
        ),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", "unsupported_value", "built-in"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type", "unsupported_value", "do not reason"),
        ({"input": [{"type": "wizard"}]}, "input[0].type", "invalid_value", "'message'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]},
            "input[0].content[0].type",
            "unsupported_value",
            "Image input",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]},
            "input[0].content[0].type",
            "unsupported_value",
            "File input",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
            "input[0].content[0].type",
            "invalid_value",
            "'input_text'",
        ),
        ({"input": [{"role": "user", "content": []}]}, "input[0].content", "empty_array", "content part"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
            "missing_required_parameter",
            "text",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "x", "x": 1}]}]},
            "input[0].content[0].x",
            "unknown_parameter",
            "x",
        ),
        ({"max_output_tokens": 15}, "max_output_tokens", "integer_below_min_value", ">= 16"),
        ({"max_output_tokens": 10_000}, "max_output_tokens", "context_length_exceeded", "maximum context length"),
        ({"temperature": 2.5}, "temperature", "decimal_above_max_value", "<= 2.0"),
        ({"top_p": 0}, "top_p", "decimal_below_min_value", "> 0.0"),
        ({"metadata": {"k": 1}}, "metadata.k", "invalid_type", "a string"),
        ({"safety_identifier": "s" * 65}, "safety_identifier", "string_above_max_length", "64"),
        ({"text": "json"}, "text", "invalid_type", "an object"),
        ({"text": {"verbosity": "low"}}, "text.verbosity", "unsupported_value", "verbosity"),
        ({"text": {"style": 1}}, "text.style", "unknown_parameter", "style"),
        ({"text": {"format": {"type": "yaml"}}}, "text.format.type", "invalid_value", "'json_schema'"),
        ({"text": {"format": {}}}, "text.format.type", "missing_required_parameter", "text.format.type"),
        (
            {"text": {"format": {"type": "json_schema", "schema": SCHEMA}}},
            "text.format.name",
            "missing_required_parameter",
            "text.format.name",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "c"}}},
            "text.format.schema",
            "missing_required_parameter",
            "text.format.schema",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "c", "schema": {"type": 3}}}},
            "text.format.schema",
            "invalid_json_schema",
            "text.format",
        ),
        (
            {"text": {"format": {"type": "json_object"}}},
            "input",
            "invalid_value",
            "'input' must contain the word 'json'",
        ),
        (
            {"text": {"format": {"type": "text", "json_schema": {}}}},
            "text.format.json_schema",
            "unknown_parameter",
            "json_schema",
        ),
        ({"model": ""}, "model", "invalid_type", "non-empty"),
    ],
)
def test_a_refused_body_names_the_responses_field(tokenizer, fields, param, code, words):
    error = refused(tokenizer, **fields)
    assert (error.param, error.code) == (param, code), error
    assert words in error.message
    # No chat field's name leaks into what the tenant reads (unless the tenant sent it).
    for chat_name in ("max_completion_tokens", "response_format", "messages"):
        assert chat_name not in error.message or chat_name in fields


def test_an_input_the_context_cannot_hold_names_input(tokenizer):
    error = refused(tokenizer, context=8, input="count from 3 to 5 and then on to 90 please")
    assert (error.param, error.code) == ("input", "context_length_exceeded")
    assert "in the input" in error.message


def test_a_line_over_the_output_budget_names_max_output_tokens(tokenizer):
    with pytest.raises(BodyError) as caught:
        parse_responses_body(
            {**VALID, "max_output_tokens": 100}, tokenizer=tokenizer, context_length=CONTEXT, max_output_units=50
        )
    assert (caught.value.param, caught.value.code) == ("max_output_tokens", "output_too_large")
    assert "Lower max_output_tokens or top_logprobs" in caught.value.message


def test_a_template_refusing_the_conversation_names_input(strict_tokenizer):
    body = {**VALID, "input": [{"role": "user", "content": "hi"}, {"role": "system", "content": "late"}]}
    with pytest.raises(BodyError) as caught:
        parse_responses_body(body, tokenizer=strict_tokenizer, context_length=CONTEXT)
    assert caught.value.param == "input" and "A system message must come first" in caught.value.message


@pytest.mark.parametrize("body", [[], "x", None, 3])
def test_a_body_that_is_not_an_object_is_refused(tokenizer, body):
    with pytest.raises(BodyError) as caught:
        parse_responses_body(body, tokenizer=tokenizer, context_length=CONTEXT)
    assert caught.value.code == "invalid_type"
