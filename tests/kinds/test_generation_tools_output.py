"""Tools in the model's text (kinds/generation/tool_format.py) and in the answer (render.py): the tool list and a
history with calls in the prompt (the Hermes format for templates that do not know tools, the template's own
rendering where it reads ``tools``, as transformers gives it), the Hermes parser for "auto", the forced call's
JSON, and the rendered message validated against OpenAI's schema and read by the SDK."""

from __future__ import annotations

import functools
import json
import re

import pytest
from openai.types.chat import ChatCompletion

from controlplane.batches.run.records import request_id
from controlplane.kinds.generation.bodies import parse_chat_body
from controlplane.kinds.generation.render import EngineChoice, EngineResult, render_completion
from controlplane.kinds.generation.tokenizer import file_tokenizer
from controlplane.kinds.generation.tool_format import hermes_calls, tool_answer
from controlplane.kinds.generation.tools import ToolCall, ToolChoice
from tests.contracts.openai_schema import validate
from tests.kinds.test_generation_tokenizer import _auto, _directory
from tests.kinds.test_generation_tools import ASKED, TIME, USER, WEATHER, body, call, parse

CHAT_SCHEMA = "CreateChatCompletionResponse"
FUNCTIONS = (
    '{"name":"get_weather","description":"The weather now","parameters":{"type":"object","properties":'
    '{"city":{"type":"string"},"unit":{"enum":["C","F"]}},"required":["city"]}}\n'
    '{"name":"get_time","parameters":{"type":"object","properties":{},"additionalProperties":false}}'
)
TOOLS_BLOCK = (
    f"You may call these functions:\n<tools>\n{FUNCTIONS}\n</tools>\n"
    'To call one, answer <tool_call>{"name":<name>,"arguments":<arguments object>}</tool_call>'
)


# --- the prompt ---------------------------------------------------------------------------------------------------


def test_a_template_without_tools_gets_them_in_a_system_message_in_the_hermes_format():
    # SmolLM2's template knows no tools: the list replaces its default system message.
    request = parse(body())
    assert request.prompt_text == (
        f"<|im_start|>system\n{TOOLS_BLOCK}<|im_end|>\n"
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )
    own = parse(body({"role": "developer", "content": "Be brief."}, USER))
    assert own.prompt_text.startswith(f"<|im_start|>system\nBe brief.\n\n{TOOLS_BLOCK}<|im_end|>\n<|im_start|>user\n")
    plain = parse(body(tools=None))  # no tools: the template's own default system message, as before
    assert plain.prompt_text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


def test_a_history_with_calls_renders_them_and_the_answers_in_the_same_format():
    request = parse(
        body(
            USER,
            {**ASKED, "tool_calls": [call("call_1"), call("call_2", "get_time", "{}")]},
            {"role": "tool", "content": "20C", "tool_call_id": "call_1"},
            {"role": "tool", "content": "noon", "tool_call_id": "call_2"},
            {"role": "assistant", "content": "It is 20C.", "tool_calls": [call("call_3", arguments="not json")]},
            {"role": "tool", "content": "?", "tool_call_id": "call_3"},
            tools=None,  # the history alone: no list in the prompt
        )
    )
    assert request.prompt_text.endswith(
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>\n'
        '<tool_call>{"name":"get_time","arguments":{}}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n20C\n</tool_response>\n<tool_response>\nnoon\n</tool_response><|im_end|>\n"
        '<|im_start|>assistant\nIt is 20C.\n<tool_call>{"name":"get_weather","arguments":"not json"}</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n?\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert "<tools>" not in request.prompt_text


# A template that reads `tools` and the calls in transformers' convention (arguments as an object).
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|> TOOLS {{ tools | tojson }} <eos> {% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|> {% if m.tool_calls %}{% for c in m.tool_calls %}"
    "CALL {{ c.id }} {{ c.function.name }} {{ c.function.arguments | tojson }} {% endfor %}"
    "{% elif m.role == 'tool' %}RESULT {{ m.tool_call_id }} {{ m.content }}{% else %}{{ m['content'] }}{% endif %}"
    " <eos> {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def test_a_template_that_reads_tools_renders_them_itself_as_transformers_does(tmp_path):
    path = _directory(tmp_path, TOOLS_TEMPLATE)
    files = file_tokenizer(path)
    assert files is not None
    line = body(USER, ASKED, {"role": "tool", "content": "20C", "tool_call_id": "call_1"}, tools=[WEATHER])
    ours = parse_chat_body(line, tokenizer=files, context_length=4096)
    theirs = parse_chat_body(line, tokenizer=_auto(path), context_length=4096)
    assert ours.prompt_text == theirs.prompt_text and ours.prompt_token_ids == theirs.prompt_token_ids
    listed = json.dumps([{"type": "function", "function": WEATHER["function"]}], ensure_ascii=False)
    assert ours.prompt_text == (
        f"<|system|> TOOLS {listed} <eos> <|user|> Weather in Paris? <eos> "
        '<|assistant|> CALL call_1 get_weather {"city": "Paris"}  <eos> <|tool|> RESULT call_1 20C <eos> <|assistant|>'
    )
    assert "<tools>" not in ours.prompt_text


# --- reading the answer -------------------------------------------------------------------------------------------


@functools.cache
def _tools():
    # Parsed on first use, not at import: collection runs beside `make install` writing the tokenizer it reads.
    return parse(body()).tools


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (
            'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
            "Let me look.",
            [("get_weather", '{"city":"Paris"}')],
        ),
        (
            '<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>\n'
            '<tool_call>{"name":"get_weather","arguments":{"city":"Oslo","unit":"C"}}</tool_call>',
            None,
            [("get_time", "{}"), ("get_weather", '{"city":"Oslo","unit":"C"}')],
        ),
        # The model may end on EOS without closing its last block.
        (
            '<tool_call>{"name":"get_weather","arguments":{"city":"Zürich"}}',
            None,
            [("get_weather", '{"city":"Zürich"}')],
        ),
    ],
)
def test_the_hermes_parser_finds_the_calls_and_keeps_the_text_around_them(text, content, calls):
    found = hermes_calls(text, _tools())
    assert found == (content, tuple(ToolCall(name, arguments) for name, arguments in calls))


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny in Paris.",  # no call at all
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name":"get_news","arguments":{}}</tool_call>',  # not a listed function
        '<tool_call>{"name":"get_weather","arguments":{"unit":"C"}}</tool_call>',  # city is required
        '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"},"id":"x"}</tool_call>',
        '<tool_call>{"name":"get_weather","arguments":"{\\"city\\":\\"Paris\\"}"}</tool_call>',  # text, not object
        '<tool_call>{"name":"get_time","arguments":{}}</tool_call><tool_call>[1]</tool_call>',  # one bad: no calls
        '<tool_call>{"name":"get_time","arguments":{"a":' + "[" * 100_000 + "]" * 100_000 + "}}",  # past json's depth
    ],
)
def test_text_that_is_not_only_valid_calls_is_the_content(text):
    assert hermes_calls(text, _tools()) is None
    assert tool_answer(text, _tools(), ToolChoice("auto"), parallel=True) == (text, ())


def test_a_schema_whose_reference_loops_gives_no_call_rather_than_an_error():
    looping = {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"$ref": "#/$defs/x"}}}
    tools = parse(body(tools=[{"type": "function", "function": {"name": "f", "parameters": looping}}])).tools
    text = '<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>'
    assert tool_answer(text, tools, ToolChoice("auto"), parallel=True) == (text, ())
    forced = '{"name":"f","arguments":{"a":1}}'
    assert tool_answer(forced, tools, ToolChoice("required"), parallel=True) == (forced, ())


def test_what_each_choice_makes_of_the_text():
    two = '<tool_call>{"name":"get_time","arguments":{}}</tool_call><tool_call>{"name":"get_time","arguments":{}}</tool_call>'
    assert len(tool_answer(two, _tools(), ToolChoice("auto"), parallel=True)[1]) == 2
    assert len(tool_answer(two, _tools(), ToolChoice("auto"), parallel=False)[1]) == 1  # at most one call
    assert tool_answer(two, _tools(), ToolChoice("none"), parallel=True) == (two, ())  # none: nothing is called
    forced = '{"name":"get_weather","arguments":{"city":"Paris"}}'
    for choice in (ToolChoice("required"), ToolChoice("function", "get_weather")):
        assert tool_answer(forced, _tools(), choice, parallel=True) == (
            None,
            (ToolCall("get_weather", '{"city":"Paris"}'),),
        )
        cut = forced[:20]  # max_tokens ended the grammar's JSON: no call, the text as it is
        assert tool_answer(cut, _tools(), choice, parallel=True) == (cut, ())


# --- the rendered answer ------------------------------------------------------------------------------------------


def _render(request, texts, *, line=7, reasons=None):
    choices = tuple(
        EngineChoice(text=text, finish_reason=(reasons or ["stop"] * len(texts))[i], completion_tokens=5)
        for i, text in enumerate(texts)
    )
    result = EngineResult(choices=choices, prompt_tokens=request.prompt_tokens)
    return render_completion(request, result, request_id=request_id("batch_1", line), created=1_800_000_000)


def test_calls_render_as_openais_message_with_tool_calls_and_finish_reason_tool_calls():
    request = parse(body(n=3, max_tokens=40))
    texts = [
        'Checking. <tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
        '<tool_call>{"name":"get_time","arguments":{}}</tool_call>',
        "It is sunny.",
        '<tool_call>{"name":"get_time","arguments":{}}',
    ]
    rendered = _render(request, texts, reasons=["stop", "stop", "length"])
    validate(rendered, CHAT_SCHEMA)
    completion = ChatCompletion.model_validate(rendered)  # what a tenant's SDK reads from the output line
    first, text, last = completion.choices
    assert first.finish_reason == "tool_calls" and first.message.content == "Checking."
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in first.message.tool_calls] == [
        ("function", "get_weather", {"city": "Paris"}),
        ("function", "get_time", {}),
    ]
    assert text.finish_reason == "stop" and text.message.tool_calls is None and text.message.content == "It is sunny."
    assert "tool_calls" not in rendered["choices"][1]["message"]  # omitted without calls, as OpenAI writes it
    assert last.finish_reason == "tool_calls" and last.message.content is None
    assert rendered["choices"][2]["message"]["content"] is None
    ids = [c.id for choice in (first, last) for c in choice.message.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids) and len(set(ids)) == 3
    assert usage_of(rendered) == (request.prompt_tokens, 15)
    # The same line rendered again (a retried shard) writes the same ids; another line, others.
    again = _render(request, texts, reasons=["stop", "stop", "length"])
    assert [c["id"] for c in again["choices"][0]["message"]["tool_calls"]] == ids[:2]
    other = _render(request, texts, line=8, reasons=["stop", "stop", "length"])
    assert not {c["id"] for c in other["choices"][0]["message"]["tool_calls"]} & set(ids)


def usage_of(rendered):
    return rendered["usage"]["prompt_tokens"], rendered["usage"]["completion_tokens"]


def test_a_forced_call_renders_as_one_call_and_a_cut_one_as_text_with_length():
    request = parse(body(tool_choice={"type": "function", "function": {"name": "get_weather"}}, n=2, max_tokens=9))
    rendered = _render(
        request, ['{"name":"get_weather","arguments":{"city":"Oslo"}}', '{"name":"get_wea'], reasons=["stop", "length"]
    )
    validate(rendered, CHAT_SCHEMA)
    called, cut = ChatCompletion.model_validate(rendered).choices
    assert called.finish_reason == "tool_calls" and called.message.content is None
    assert [(c.function.name, c.function.arguments) for c in called.message.tool_calls] == [
        ("get_weather", '{"city":"Oslo"}')
    ]
    assert cut.finish_reason == "length" and cut.message.content == '{"name":"get_wea' and not cut.message.tool_calls


def test_with_tool_choice_none_a_call_in_the_text_stays_text():
    request = parse(body(tool_choice="none", tools=[TIME]))
    text = '<tool_call>{"name":"get_time","arguments":{}}</tool_call>'
    rendered = _render(request, [text])
    validate(rendered, CHAT_SCHEMA)
    assert rendered["choices"][0]["message"]["content"] == text and rendered["choices"][0]["finish_reason"] == "stop"
