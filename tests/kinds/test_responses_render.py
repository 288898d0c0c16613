"""Rendered ``response`` objects validate against OpenAI's published Response schema (strictly: null only
where the spec allows it) and parse with the openai SDK; a line cut at its limit is "incomplete"; the echo
repeats the request. Then the kind: its line errors name the Responses fields, and it keeps no columns."""

from __future__ import annotations

import copy

import pytest
from openai.types.responses import Response

from controlplane.batches.run.records import request_id
from controlplane.kinds.base import BodyIssue
from controlplane.kinds.generation.render import EngineChoice, EngineResult
from controlplane.kinds.generation.responses_render import render_response
from controlplane.kinds.registry import kind_for
from tests.contracts.openai_schema import schema_errors, validate
from tests.kinds.test_contract import _generation_model
from tests.kinds.test_responses_parse import responses
from tests.support.structured_schema import SCHEMA

SCHEMA_NAME = "Response"
RID = request_id("batch_1", 7)


def _result(request, *, finish="stop", tokens=3, cached=0):
    choice = EngineChoice(text="3 4 5"[: 2 * tokens - 1], finish_reason=finish, completion_tokens=tokens)
    return EngineResult(choices=(choice,), prompt_tokens=request.prompt_tokens, cached_tokens=cached)


def _render(request, result):
    return render_response(request, result, request_id=RID, created=1_800_000_000)


def test_a_completed_response_conforms_and_parses_with_the_sdk(tokenizer):
    request = responses(tokenizer, instructions="be brief", max_output_tokens=16, metadata={"k": "v"}, user="u")
    body = _render(request, _result(request, cached=2))
    validate(body, SCHEMA_NAME)
    parsed = Response.model_validate(body)
    assert parsed.id == f"resp_{RID}" and parsed.object == "response" and parsed.status == "completed"
    assert parsed.output_text == "3 4 5" and parsed.incomplete_details is None and parsed.error is None
    [message] = parsed.output
    assert message.type == "message" and message.id == f"msg_{RID}" and message.status == "completed"
    assert message.role == "assistant" and message.content[0].type == "output_text"
    usage = parsed.usage
    assert (usage.input_tokens, usage.output_tokens) == (request.prompt_tokens, 3)
    assert usage.total_tokens == request.prompt_tokens + 3 and usage.input_tokens_details.cached_tokens == 2
    assert usage.output_tokens_details.reasoning_tokens == 0
    # The echo repeats the request.
    assert (parsed.instructions, parsed.max_output_tokens, parsed.metadata, parsed.user) == (
        "be brief",
        16,
        {"k": "v"},
        "u",
    )
    assert (parsed.temperature, parsed.top_p, parsed.tools, parsed.tool_choice) == (1.0, 1.0, [], "auto")
    assert parsed.text.format.type == "text" and parsed.parallel_tool_calls is True
    assert "output_text" not in body  # the SDK's convenience property, not a wire field


def test_a_response_cut_at_its_limit_is_incomplete(tokenizer):
    request = responses(tokenizer, max_output_tokens=16)
    body = _render(request, _result(request, finish="length", tokens=16))
    validate(body, SCHEMA_NAME)
    parsed = Response.model_validate(body)
    assert parsed.status == "incomplete" and parsed.incomplete_details.reason == "max_output_tokens"
    assert parsed.output[0].status == "incomplete" and body["completed_at"] is None


def test_logprobs_are_on_the_output_text_when_included(tokenizer):
    from tests.kinds.test_generation_render import _logprobs

    request = responses(tokenizer, include=["message.output_text.logprobs"], top_logprobs=1, max_output_tokens=16)
    choice = EngineChoice(text="3 4", finish_reason="stop", completion_tokens=2, logprobs=_logprobs(["3", " 4"]))
    body = _render(request, EngineResult(choices=(choice,), prompt_tokens=request.prompt_tokens))
    validate(body, SCHEMA_NAME)
    [part] = Response.model_validate(body).output[0].content
    assert [entry.token for entry in part.logprobs] == ["3", " 4"] and body["top_logprobs"] == 1
    assert [len(entry.top_logprobs) for entry in part.logprobs] == [1, 1]  # cut to what was asked
    assert part.logprobs[0].bytes == [ord("3")]


def test_a_json_schema_format_is_echoed_as_sent(tokenizer):
    text = {"format": {"type": "json_schema", "name": "counting", "schema": SCHEMA, "strict": True, "description": "n"}}
    request = responses(tokenizer, input="count as json", text=text)
    body = _render(request, _result(request))
    validate(body, SCHEMA_NAME)
    assert body["text"] == text
    assert Response.model_validate(body).text.format.schema_ == SCHEMA


def test_the_request_without_user_omits_it_rather_than_null(tokenizer):
    request = responses(tokenizer)
    body = _render(request, _result(request))
    assert "user" not in body
    validate(body, SCHEMA_NAME)


@pytest.mark.parametrize("path", ["id", "object", "created_at", "output", "model", "instructions", "tools", "metadata"])
def test_dropping_a_required_field_fails_validation(tokenizer, path):
    request = responses(tokenizer)
    body = copy.deepcopy(_render(request, _result(request)))
    del body[path]
    assert schema_errors(body, SCHEMA_NAME)


def test_an_engine_answer_that_cannot_be_the_requests_is_refused(tokenizer):
    request = responses(tokenizer, max_output_tokens=16)
    with pytest.raises(ValueError, match="completion tokens for max_tokens=16"):
        _render(request, _result(request, tokens=17))
    two = EngineResult(choices=_result(request).choices * 2, prompt_tokens=request.prompt_tokens)
    with pytest.raises(ValueError, match="choices"):
        _render(request, two)


# --- the kind -------------------------------------------------------------------------------------


def test_the_kind_names_the_text_format_when_the_model_cannot_constrain_decoding():
    kind, model = kind_for("/v1/responses"), _generation_model(8)
    model.structured_outputs = False
    body = {"model": "tinylm", "input": "count as json", "text": {"format": {"type": "json_object"}}}
    with pytest.raises(BodyIssue) as caught:
        kind.parse_body(body, model=model)
    assert caught.value.param == "body.text.format" and "text.format" in caught.value.message
    assert "response_format" not in caught.value.message


def test_the_kind_names_the_schema_the_decoding_library_cannot_compile():
    kind, model = kind_for("/v1/responses"), _generation_model(8)
    model.structured_outputs = True
    text = {"format": {"type": "json_schema", "name": "bad", "schema": {"not": {"type": "string"}}}}
    with pytest.raises(BodyIssue) as caught:
        kind.parse_body({"model": "tinylm", "input": "x", "text": text}, model=model)
    assert (caught.value.param, caught.value.code) == ("body.text.format.schema", "invalid_json_schema")


def test_shard_columns_keep_the_echo():
    from controlplane.kinds.base import ParsedLine
    from controlplane.kinds.generation.columns import generation_columns_decode, generation_columns_encode

    kind, model = kind_for("/v1/responses"), _generation_model(8)
    assert kind.columns_collector(model, batch_id="batch_1", attempt=1, save=lambda name, data: None) is not None
    body = {"model": "tinylm", "input": "count from 3 to 5", "instructions": "be brief", "max_output_tokens": 16}
    line = kind.parse_body(body, model=model)
    assert kind.work_units(line) >= 1 and line.request.echo.instructions == "be brief"
    chat = kind_for("/v1/chat/completions").parse_body(
        {"model": "tinylm", "messages": [{"role": "user", "content": "x"}]}, model=model
    )
    encoded = generation_columns_encode(
        "tinylm", [(1, ParsedLine("a", "tinylm", line)), (2, ParsedLine("b", "tinylm", chat))]
    )
    _, lines = generation_columns_decode(encoded)
    assert lines[1].request.request == line.request  # a ResponsesRequest again, its echo kept
    assert type(lines[2].request.request) is type(chat.request) and lines[2].request.request == chat.request
