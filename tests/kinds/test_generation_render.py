"""Rendered chat.completion / text_completion objects validate against OpenAI's published schemas (strictly:
null only where the spec allows it) and parse with the openai SDK; dropping a required field fails."""

from __future__ import annotations

import copy
import math

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from controlplane.batches.run.records import request_id
from controlplane.kinds.generation.render import (
    LOGPROB_FLOOR,
    EngineChoice,
    EngineResult,
    TokenLogprob,
    TopLogprob,
    completion_id,
    render_chat_completion,
    render_completion,
    render_text_completion,
)
from tests.contracts.openai_schema import schema_errors, validate
from tests.kinds.test_generation_bodies import chat, completion

CHAT_SCHEMA, TEXT_SCHEMA = "CreateChatCompletionResponse", "CreateCompletionResponse"


def _logprobs(tokens, top=2):
    return tuple(
        TokenLogprob(
            token=token,
            logprob=-0.1 * (i + 1),
            top=tuple(TopLogprob(token=f"{token}{k}", logprob=-1.0 - k) for k in range(top)),
        )
        for i, token in enumerate(tokens)
    )


def _result(request, *, with_logprobs, cached=0):
    """n choices alternating stop and length, each with its own tokens."""
    choices = []
    for index in range(request.n):
        tokens = ["3", " 4", " 5"][: 1 + index % 3]
        choices.append(
            EngineChoice(
                text="".join(tokens),
                finish_reason="stop" if index % 2 == 0 else "length",
                completion_tokens=len(tokens),
                logprobs=_logprobs(tokens) if with_logprobs else None,
            )
        )
    return EngineResult(choices=tuple(choices), prompt_tokens=request.prompt_tokens, cached_tokens=cached)


def _render(request, result, **extra):
    return render_completion(request, result, request_id=request_id("batch_1", 7), created=1_800_000_000, **extra)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("with_logprobs", [False, True])
def test_chat_completion_conforms(tokenizer, n, with_logprobs):
    request = chat(tokenizer, n=n, logprobs=with_logprobs or None, top_logprobs=2 if with_logprobs else None)
    result = _result(request, with_logprobs=with_logprobs, cached=1)
    body = _render(request, result)
    validate(body, CHAT_SCHEMA)
    parsed = ChatCompletion.model_validate(body)  # what a tenant's SDK reads from the output line
    assert [c.message.content for c in parsed.choices] == [c.text for c in result.choices]
    assert [c.finish_reason for c in parsed.choices] == [c.finish_reason for c in result.choices]
    assert parsed.usage is not None and parsed.usage.prompt_tokens_details is not None
    assert (parsed.usage.prompt_tokens, parsed.usage.completion_tokens) == (
        request.prompt_tokens,
        result.completion_tokens,
    )
    assert parsed.usage.total_tokens == request.prompt_tokens + result.completion_tokens
    assert parsed.usage.prompt_tokens_details.cached_tokens == 1
    assert "system_fingerprint" not in body  # typed string in the spec: absent, never null
    if with_logprobs:
        first = parsed.choices[0].logprobs
        assert first is not None and first.content is not None
        assert [e.token for e in first.content] == ["3"]
        assert first.content[0].bytes == list(b"3")
        assert [a.token for a in first.content[0].top_logprobs] == ["30", "31"]
    else:
        assert all(c.logprobs is None for c in parsed.choices)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("with_logprobs", [False, True])
def test_text_completion_conforms(tokenizer, n, with_logprobs):
    request = completion(tokenizer, n=n, logprobs=2 if with_logprobs else None)
    result = _result(request, with_logprobs=with_logprobs)
    body = _render(request, result, system_fingerprint="fp_tiny")
    validate(body, TEXT_SCHEMA)
    parsed = Completion.model_validate(body)
    assert parsed.object == "text_completion" and parsed.system_fingerprint == "fp_tiny"
    assert [c.text for c in parsed.choices] == [c.text for c in result.choices]
    if with_logprobs and n == 3:
        third = parsed.choices[2].logprobs
        assert third is not None
        assert third.tokens == ["3", " 4", " 5"]
        assert third.text_offset == [0, 1, 3]  # character offsets of each token in the choice's text
        assert third.token_logprobs == pytest.approx([-0.1, -0.2, -0.3])
        assert third.top_logprobs == [{"30": -1.0, "31": -2.0}, {" 40": -1.0, " 41": -2.0}, {" 50": -1.0, " 51": -2.0}]


def test_top_logprobs_are_cut_to_what_was_asked(tokenizer):
    request = chat(tokenizer, logprobs=True, top_logprobs=1)
    choice = EngineChoice(text="3", finish_reason="stop", completion_tokens=1, logprobs=_logprobs(["3"], top=5))
    body = _render(request, EngineResult(choices=(choice,), prompt_tokens=request.prompt_tokens))
    assert len(body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1


def test_an_impossible_token_is_written_as_openais_floor(tokenizer):
    request = completion(tokenizer, logprobs=1)
    entry = TokenLogprob(token="x", logprob=-math.inf, top=(TopLogprob(token="y", logprob=-math.inf),))
    choice = EngineChoice(text="x", finish_reason="length", completion_tokens=1, logprobs=(entry,))
    body = _render(request, EngineResult(choices=(choice,), prompt_tokens=request.prompt_tokens))
    assert body["choices"][0]["logprobs"]["token_logprobs"] == [LOGPROB_FLOOR]
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{"y": LOGPROB_FLOOR}]
    validate(body, TEXT_SCHEMA)


def test_ids_follow_the_output_lines_request_id(tokenizer):
    request = chat(tokenizer)
    result = _result(request, with_logprobs=False)
    first = _render(request, result)
    assert first["id"] == "chatcmpl-" + request_id("batch_1", 7)
    assert _render(request, result)["id"] == first["id"]  # a regenerated line keeps its id
    assert completion_id("chat", request_id("batch_1", 8)) != first["id"]
    assert completion_id("completion", request_id("batch_1", 7)).startswith("cmpl-")
    assert (first["created"], first["model"], first["service_tier"]) == (1_800_000_000, "tiny", "default")


CHAT_REQUIRED = [
    ("id",),
    ("object",),
    ("created",),
    ("model",),
    ("choices",),
    ("choices", 1, "finish_reason"),
    ("choices", 1, "index"),
    ("choices", 1, "message"),
    ("choices", 1, "logprobs"),
    ("choices", 0, "message", "role"),
    ("choices", 0, "message", "content"),
    ("choices", 0, "message", "refusal"),
    ("choices", 0, "logprobs", "content"),
    ("choices", 0, "logprobs", "refusal"),
    ("choices", 0, "logprobs", "content", 0, "token"),
    ("choices", 0, "logprobs", "content", 0, "logprob"),
    ("choices", 0, "logprobs", "content", 0, "bytes"),
    ("choices", 0, "logprobs", "content", 0, "top_logprobs"),
    ("choices", 0, "logprobs", "content", 0, "top_logprobs", 0, "bytes"),
    ("usage", "prompt_tokens"),
    ("usage", "completion_tokens"),
    ("usage", "total_tokens"),
]
TEXT_REQUIRED = [
    ("id",),
    ("object",),
    ("created",),
    ("model",),
    ("choices",),
    ("choices", 0, "text"),
    ("choices", 0, "index"),
    ("choices", 0, "logprobs"),
    ("choices", 1, "finish_reason"),
    ("usage", "total_tokens"),
]


def _path_id(path):
    return ".".join(map(str, path))


def _without(body, path):
    mutated = copy.deepcopy(body)
    parent = mutated
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return mutated


@pytest.mark.parametrize("path", CHAT_REQUIRED, ids=_path_id)
def test_dropping_a_required_chat_field_fails_validation(tokenizer, path):
    request = chat(tokenizer, n=2, logprobs=True, top_logprobs=2)
    body = _render(request, _result(request, with_logprobs=True))
    assert schema_errors(body, CHAT_SCHEMA) == []
    assert schema_errors(_without(body, path), CHAT_SCHEMA), f"{path} dropped and still valid"


@pytest.mark.parametrize("path", TEXT_REQUIRED, ids=_path_id)
def test_dropping_a_required_completion_field_fails_validation(tokenizer, path):
    request = completion(tokenizer, n=2, logprobs=2)
    body = _render(request, _result(request, with_logprobs=True))
    assert schema_errors(body, TEXT_SCHEMA) == []
    assert schema_errors(_without(body, path), TEXT_SCHEMA), f"{path} dropped and still valid"


@pytest.mark.parametrize(
    ("path", "value"),
    [(("object",), "chat.completions"), (("choices", 0, "finish_reason"), "done"), (("system_fingerprint",), None)],
)
def test_a_wrong_value_fails_validation(tokenizer, path, value):
    request = chat(tokenizer)
    body = _render(request, _result(request, with_logprobs=False))
    mutated = copy.deepcopy(body)
    target = mutated
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert schema_errors(mutated, CHAT_SCHEMA)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"n": 2}, "choices for n=2"),
        ({"cached": 10**6}, "cached_tokens"),
        ({"logprobs": True}, "asked for logprobs"),
        ({"max_tokens": 1}, "completion tokens for max_tokens=1"),
    ],
)
def test_an_engine_answer_that_cannot_be_the_requests_is_refused(tokenizer, change, reason):
    fields = {key: change[key] for key in ("n", "logprobs", "max_tokens") if key in change}
    request = chat(tokenizer, **fields)
    choice = EngineChoice(text="3 4", finish_reason="stop", completion_tokens=2)
    result = EngineResult(choices=(choice,), prompt_tokens=request.prompt_tokens, cached_tokens=change.get("cached", 0))
    for render in (render_chat_completion, render_text_completion):
        with pytest.raises(ValueError, match=reason):
            render(request, result, completion_id="x", created=0)
