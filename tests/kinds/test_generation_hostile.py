"""Every bad generation body the chat kind refuses: each is one line error naming the field (`param`) with a stable
code, rendered as OpenAI's error body. Each case is a valid body with one thing changed, so a case passes only
for the reason it names."""

from __future__ import annotations

import pickle

import pytest

from controlplane.batches.run.records import failed_response_record
from controlplane.kinds.generation.bodies import BodyError, parse_chat_body, parse_completion_body
from tests.contracts.openai_schema import validate
from tests.kinds.conftest import CONTEXT

DROP = object()  # a field removed from the valid body
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def _msgs(*messages):
    return {"messages": list(messages)}


def _user(content, **extra):
    return {"role": "user", "content": content, **extra}


def _fmt(schema=None, **json_schema):
    spec = {"name": "out", "schema": {"type": "object"} if schema is None else schema, **json_schema}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}


CHAT_CASES = [
    # (id, changes to the valid body, param, code)
    ("no model", {"model": DROP}, "model", "missing_required_parameter"),
    ("model not a string", {"model": 5}, "model", "invalid_type"),
    ("no messages", {"messages": DROP}, "messages", "missing_required_parameter"),
    ("empty messages", {"messages": []}, "messages", "empty_array"),
    ("messages not a list", {"messages": "hi"}, "messages", "invalid_type"),
    ("message not an object", _msgs(5), "messages[0]", "invalid_type"),
    ("wrong role", _msgs(_user("x"), {"role": "wizard", "content": "x"}), "messages[1].role", "invalid_value"),
    ("no role", _msgs({"content": "x"}), "messages[0].role", "missing_required_parameter"),
    (
        "tool message answering no call",
        _msgs(_user("x"), {"role": "tool", "content": "x", "tool_call_id": "t"}),
        "messages[1].tool_call_id",
        "invalid_value",
    ),
    ("non-string content", _msgs(_user(5)), "messages[0].content", "invalid_type"),
    ("no content", _msgs({"role": "user"}), "messages[0].content", "missing_required_parameter"),
    ("empty content parts", _msgs(_user([])), "messages[0].content", "empty_array"),
    (
        "image part",
        _msgs(_user([{"type": "text", "text": "see"}, IMAGE])),
        "messages[0].content[1].type",
        "unsupported_value",
    ),
    ("audio part", _msgs(_user([AUDIO])), "messages[0].content[0].type", "unsupported_value"),
    ("unknown part type", _msgs(_user([{"type": "video"}])), "messages[0].content[0].type", "invalid_value"),
    (
        "non-string text part",
        _msgs(_user([{"type": "text", "text": 5}])),
        "messages[0].content[0].text",
        "invalid_type",
    ),
    (
        "part without text",
        _msgs(_user([{"type": "text"}])),
        "messages[0].content[0].text",
        "missing_required_parameter",
    ),
    ("unknown message field", _msgs(_user("x", mood="sad")), "messages[0].mood", "unknown_parameter"),
    ("non-string name", _msgs(_user("x", name=5)), "messages[0].name", "invalid_type"),
    (
        "a tool definition as a tool call",
        _msgs(_user("x"), {"role": "assistant", "content": "y", "tool_calls": [TOOL]}),
        "messages[1].tool_calls[0].id",
        "missing_required_parameter",
    ),
    ("n above 8", {"n": 9}, "n", "integer_above_max_value"),
    ("n zero", {"n": 0}, "n", "integer_below_min_value"),
    ("n a float", {"n": 1.5}, "n", "invalid_type"),
    ("n a boolean", {"n": True}, "n", "invalid_type"),
    ("max_tokens zero", {"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    ("max_tokens negative", {"max_tokens": -3}, "max_tokens", "integer_below_min_value"),
    ("max_completion_tokens zero", {"max_completion_tokens": 0}, "max_completion_tokens", "integer_below_min_value"),
    ("max_tokens over context", {"max_tokens": CONTEXT}, "max_tokens", "context_length_exceeded"),
    # Huge values are a context error, never an overflow: past int64 and far past any context.
    ("max_tokens huge", {"max_tokens": 10**18}, "max_tokens", "context_length_exceeded"),
    ("max_tokens past int64", {"max_tokens": 2**64}, "max_tokens", "context_length_exceeded"),
    ("max_tokens a huge float", {"max_tokens": 1e30}, "max_tokens", "invalid_type"),
    ("messages a string", {"messages": "count from 1 to 3"}, "messages", "invalid_type"),
    ("message an array", _msgs(["user", "hi"]), "messages[0]", "invalid_type"),
    ("message without content", _msgs({"role": "user"}), "messages[0].content", "missing_required_parameter"),
    (
        "text part without text",
        _msgs(_user([{"type": "text", "text": "hi"}, {"type": "text"}])),
        "messages[0].content[1].text",
        "missing_required_parameter",
    ),
    ("name not a string", _msgs(_user("hi", name=5)), "messages[0].name", "invalid_type"),
    (
        "max_completion_tokens over context",
        {"max_completion_tokens": 10**12},
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    ("aliases disagree", {"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens", "invalid_value"),
    ("prompt over context", _msgs(_user("word " * CONTEXT)), "messages", "context_length_exceeded"),
    ("temperature above 2", {"temperature": 2.01}, "temperature", "decimal_above_max_value"),
    ("temperature below 0", {"temperature": -0.1}, "temperature", "decimal_below_min_value"),
    ("temperature a string", {"temperature": "hot"}, "temperature", "invalid_type"),
    ("top_p zero", {"top_p": 0}, "top_p", "decimal_below_min_value"),
    ("top_p above 1", {"top_p": 1.5}, "top_p", "decimal_above_max_value"),
    ("presence_penalty above 2", {"presence_penalty": 2.5}, "presence_penalty", "decimal_above_max_value"),
    ("frequency_penalty below -2", {"frequency_penalty": -3}, "frequency_penalty", "decimal_below_min_value"),
    ("seed past int64", {"seed": 2**63}, "seed", "integer_above_max_value"),
    ("seed a string", {"seed": "7"}, "seed", "invalid_type"),
    ("stop with 5 entries", {"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
    ("stop empty list", {"stop": []}, "stop", "empty_array"),
    ("stop not strings", {"stop": ["a", 1]}, "stop[1]", "invalid_type"),
    ("stop empty string", {"stop": ""}, "stop", "invalid_value"),
    ("stop a number", {"stop": 5}, "stop", "invalid_type"),
    ("logprobs not a boolean", {"logprobs": "yes"}, "logprobs", "invalid_type"),
    ("top_logprobs above 20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
    ("top_logprobs negative", {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "integer_below_min_value"),
    ("top_logprobs without logprobs", {"top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ("unknown response_format", {"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
    ("response_format not an object", {"response_format": "json"}, "response_format", "invalid_type"),
    ("response_format without type", {"response_format": {}}, "response_format.type", "missing_required_parameter"),
    (
        "json_schema missing",
        {"response_format": {"type": "json_schema"}},
        "response_format.json_schema",
        "missing_required_parameter",
    ),
    ("json_schema bad name", _fmt(name="has space"), "response_format.json_schema.name", "invalid_value"),
    ("json_schema no schema", _fmt(schema=DROP), "response_format.json_schema.schema", "missing_required_parameter"),
    ("invalid JSON schema", _fmt({"type": "objekt"}), "response_format.json_schema.schema", "invalid_json_schema"),
    (
        "invalid nested JSON schema",
        _fmt({"properties": {"a": {"minimum": "x"}}}),
        "response_format.json_schema.schema",
        "invalid_json_schema",
    ),
    ("schema not an object", _fmt([]), "response_format.json_schema.schema", "invalid_type"),
    ("strict not a boolean", _fmt(strict="yes"), "response_format.json_schema.strict", "invalid_type"),
    ("stream true", {"stream": True}, "stream", "unsupported_value"),
    ("stream_options", {"stream_options": {"include_usage": True}}, "stream_options", "unsupported_parameter"),
    ("custom tools", {"tools": [{"type": "custom", "custom": {"name": "f"}}]}, "tools[0].type", "unsupported_value"),
    ("tool_choice without tools", {"tool_choice": "auto"}, "tool_choice", "invalid_value"),
    ("functions", {"functions": [TOOL["function"]]}, "functions", "unsupported_parameter"),
    ("logit_bias", {"logit_bias": {"50256": -100}}, "logit_bias", "unsupported_value"),
    ("audio output", {"modalities": ["text", "audio"]}, "modalities", "unsupported_value"),
    ("store true", {"store": True}, "store", "unsupported_value"),
    ("flex tier", {"service_tier": "flex"}, "service_tier", "unsupported_value"),
    ("unknown field", {"temprature": 0.5}, "temprature", "unknown_parameter"),
    ("completions field on chat", {"prompt": "x"}, "prompt", "unknown_parameter"),
    (
        "metadata too many keys",
        {"metadata": {str(i): "v" for i in range(17)}},
        "metadata",
        "object_above_max_properties",
    ),
    ("metadata non-string value", {"metadata": {"a": 1}}, "metadata.a", "invalid_type"),
    ("metadata not an object", {"metadata": ["a"]}, "metadata", "invalid_type"),
    ("user not a string", {"user": 5}, "user", "invalid_type"),
    ("safety_identifier too long", {"safety_identifier": "x" * 65}, "safety_identifier", "string_above_max_length"),
]

COMPLETION_CASES = [
    ("no prompt", {"prompt": DROP}, "prompt", "missing_required_parameter"),
    ("several prompts", {"prompt": ["a", "b"]}, "prompt", "unsupported_value"),
    ("token ids", {"prompt": [1, 2, 3]}, "prompt", "unsupported_value"),
    ("batched token ids", {"prompt": [[1, 2], [3]]}, "prompt", "unsupported_value"),
    ("prompt a number", {"prompt": 5}, "prompt", "invalid_type"),
    ("empty prompt", {"prompt": ""}, "prompt", "invalid_value"),
    ("empty prompt list", {"prompt": []}, "prompt", "invalid_type"),
    ("no model", {"model": DROP}, "model", "missing_required_parameter"),
    ("logprobs above 5", {"logprobs": 6}, "logprobs", "integer_above_max_value"),
    ("logprobs a boolean", {"logprobs": True}, "logprobs", "invalid_type"),
    ("max_tokens zero", {"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    ("max_tokens over context", {"max_tokens": CONTEXT}, "max_tokens", "context_length_exceeded"),
    ("n above 8", {"n": 9}, "n", "integer_above_max_value"),
    ("temperature above 2", {"temperature": 3}, "temperature", "decimal_above_max_value"),
    ("stop with 5 entries", {"stop": list("abcde")}, "stop", "array_above_max_length"),
    ("echo", {"echo": True}, "echo", "unsupported_value"),
    ("best_of", {"best_of": 3}, "best_of", "unsupported_value"),
    ("suffix", {"suffix": "end"}, "suffix", "unsupported_value"),
    ("stream true", {"stream": True}, "stream", "unsupported_value"),
    ("chat field on completions", {"messages": [_user("x")]}, "messages", "unknown_parameter"),
    (
        "response_format on completions",
        {"response_format": {"type": "json_object"}},
        "response_format",
        "unknown_parameter",
    ),
    (
        "max_completion_tokens on completions",
        {"max_completion_tokens": 5},
        "max_completion_tokens",
        "unknown_parameter",
    ),
]

VALID_CHAT = {"model": "tiny", "messages": [_user("count from 3 to 5")]}
VALID_COMPLETION = {"model": "tiny", "prompt": "count from 3 to 5 :"}


def _changed(valid, changes):
    body = dict(valid)
    for key, value in changes.items():
        if value is DROP:
            body.pop(key, None)
        else:
            body[key] = value
    # A DROP inside response_format.json_schema (the `_fmt(schema=DROP)` case).
    spec = body.get("response_format", {}).get("json_schema") if isinstance(body.get("response_format"), dict) else None
    if isinstance(spec, dict) and spec.get("schema") is DROP:
        del spec["schema"]
    return body


def _error(parse, body, tokenizer):
    with pytest.raises(BodyError) as caught:
        parse(body, tokenizer=tokenizer, context_length=CONTEXT)
    return caught.value


def _check(error, param, code):
    assert (error.param, error.code) == (param, code), error.message
    assert error.status_code == 400 and error.message
    # The error file's body is OpenAI's ErrorResponse, naming the field.
    body = error.error_body()
    validate(body, "ErrorResponse")
    assert body["error"] == {"message": error.message, "type": "invalid_request_error", "param": param, "code": code}


@pytest.mark.parametrize(("changes", "param", "code"), [c[1:] for c in CHAT_CASES], ids=[c[0] for c in CHAT_CASES])
def test_bad_chat_body(tokenizer, changes, param, code):
    _check(_error(parse_chat_body, _changed(VALID_CHAT, changes), tokenizer), param, code)


@pytest.mark.parametrize(
    ("changes", "param", "code"), [c[1:] for c in COMPLETION_CASES], ids=[c[0] for c in COMPLETION_CASES]
)
def test_bad_completion_body(tokenizer, changes, param, code):
    _check(_error(parse_completion_body, _changed(VALID_COMPLETION, changes), tokenizer), param, code)


def test_the_valid_bodies_the_cases_start_from_are_valid(tokenizer):
    # Without this, a case could pass because the base body itself was refused.
    parse_chat_body(VALID_CHAT, tokenizer=tokenizer, context_length=CONTEXT)
    parse_completion_body(VALID_COMPLETION, tokenizer=tokenizer, context_length=CONTEXT)


@pytest.mark.parametrize("body", [None, [], "text", 5, True, [VALID_CHAT]])
def test_a_body_that_is_not_an_object(tokenizer, body):
    for parse in (parse_chat_body, parse_completion_body):
        _check(_error(parse, body, tokenizer), None, "invalid_type")


def test_the_error_file_line_is_a_400_with_openais_error_body(tokenizer):
    error = _error(parse_chat_body, _changed(VALID_CHAT, {"n": 9}), tokenizer)
    record = failed_response_record(
        "batch_1", 3, "req-3", status_code=error.status_code, message=error.message, code=error.code
    )
    assert (record["custom_id"], record["response"]["status_code"], record["error"]) == ("req-3", 400, None)
    validate(record["response"]["body"], "ErrorResponse")
    expected = error.error_body()["error"]
    assert {k: v for k, v in record["response"]["body"]["error"].items() if k != "param"} == {
        k: v for k, v in expected.items() if k != "param"
    }


def test_the_error_file_line_names_the_field(tokenizer):
    error = _error(parse_chat_body, _changed(VALID_CHAT, {"n": 9}), tokenizer)
    record = failed_response_record(
        "batch_1", 3, "req-3", status_code=400, message=error.message, code=error.code, param=error.param
    )
    assert record["response"]["body"] == error.error_body()


def test_a_line_error_survives_pickling(tokenizer):
    error = _error(parse_chat_body, _changed(VALID_CHAT, {"n": 9}), tokenizer)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.param, copy.code, copy.message, str(copy)) == (error.param, error.code, error.message, error.message)
