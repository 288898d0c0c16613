"""Valid chat and completions bodies: every honoured field reaches the request, defaults are OpenAI's, the
prompt is the chat template's text and its tokens are the tokenizer's."""

from __future__ import annotations

import json

import pytest

from controlplane.kinds.generation.bodies import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    BodyError,
    parse_chat_body,
    parse_completion_body,
)
from tests.kinds.conftest import CONTEXT


def chat(tokenizer, context=CONTEXT, **fields):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count from 3 to 5"}], **fields}
    return parse_chat_body(body, tokenizer=tokenizer, context_length=context)


def completion(tokenizer, context=CONTEXT, **fields):
    body = {"model": "tiny", "prompt": "count from 3 to 5 :", **fields}
    return parse_completion_body(body, tokenizer=tokenizer, context_length=context)


def test_chat_prompt_is_the_templates_text_and_its_tokens(tokenizer):
    request = chat(tokenizer, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
    assert request.kind == "chat"
    assert request.prompt_text == "<system> be brief\n<user> hi\n<assistant>"
    # What an engine prefills: the text tokenized as vLLM's backend tokenizes a text prompt, special tokens on.
    assert request.prompt_token_ids == tuple(tokenizer.encode(request.prompt_text, add_special_tokens=True))
    assert request.prompt_tokens == len(request.prompt_token_ids) > 0


def _bos_tokenizer(tmp_path, *, adds_bos: bool):
    """A Llama-like tokenizer (its post-processor adds <s> when asked, or not) whose chat template writes <s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from controlplane.kinds.generation.tokenizer import file_tokenizer

    vocab = {"<unk>": 0, "<s>": 1, "<user>": 2, "<assistant>": 3, "hi": 4, "there": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<s>", "<user>", "<assistant>"])
    if adds_bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}<user> {{ m['content'] }} {% endfor %}<assistant>"
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return file_tokenizer(tmp_path)


@pytest.mark.parametrize("adds_bos", [True, False])
def test_a_chat_prompt_holds_one_bos_whether_or_not_the_tokenizer_adds_one(tmp_path, adds_bos):
    tokenizer = _bos_tokenizer(tmp_path, adds_bos=adds_bos)
    request = chat(tokenizer, messages=[{"role": "user", "content": "hi there"}])
    assert request.prompt_token_ids == (1, 2, 4, 5, 3)  # <s> <user> hi there <assistant>: the template's, once
    # The text sent: the engines (vLLM's backend, the CPU engine) add the tokenizer's BOS to it themselves.
    assert request.prompt_text == ("<user> hi there <assistant>" if adds_bos else "<s><user> hi there <assistant>")
    assert tuple(tokenizer.encode(request.prompt_text, add_special_tokens=True)) == request.prompt_token_ids


def test_developer_is_system_and_text_parts_are_joined(tokenizer):
    request = chat(
        tokenizer,
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "rule one"}, {"type": "text", "text": "two"}]},
            {"role": "user", "content": "q", "name": "ann"},
            {"role": "assistant", "content": "a", "tool_calls": None, "refusal": None},
            {"role": "user", "content": [{"type": "text", "text": "again"}]},
        ],
    )
    assert request.prompt_text == "<system> rule one\ntwo\n<user>(ann) q\n<assistant> a\n<user> again\n<assistant>"


def test_chat_defaults(tokenizer):
    request = chat(tokenizer)
    assert (request.temperature, request.top_p, request.n, request.seed, request.stop) == (1.0, 1.0, 1, None, ())
    assert (request.presence_penalty, request.frequency_penalty) == (0.0, 0.0)
    assert (request.logprobs, request.top_logprobs, request.user, request.metadata) == (False, 0, None, None)
    assert request.response_format.type == "text"
    # OpenAI's chat: without a limit the completion may use the rest of the context.
    assert request.max_tokens == CONTEXT - request.prompt_tokens


def test_chat_fields_are_honoured(tokenizer):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    request = chat(
        tokenizer,
        max_completion_tokens=7,
        temperature=0.5,
        top_p=0.25,
        seed=-42,
        stop=["\n", "9"],
        n=3,
        presence_penalty=-1.5,
        frequency_penalty=2,
        logprobs=True,
        top_logprobs=4,
        response_format={"type": "json_schema", "json_schema": {"name": "count", "schema": schema, "strict": True}},
        user="u-1",
        metadata={"b": "2", "a": "1"},
    )
    assert (request.max_tokens, request.temperature, request.top_p, request.seed) == (7, 0.5, 0.25, -42)
    assert (request.stop, request.n, request.presence_penalty, request.frequency_penalty) == (("\n", "9"), 3, -1.5, 2.0)
    assert (request.logprobs, request.top_logprobs, request.user) == (True, 4, "u-1")
    assert request.metadata == (("a", "1"), ("b", "2"))
    fmt = request.response_format
    assert (fmt.type, fmt.name, fmt.strict) == ("json_schema", "count", True)
    assert json.loads(fmt.schema or "") == schema


@pytest.mark.parametrize(
    "fields", [{"max_tokens": 9}, {"max_completion_tokens": 9}, {"max_tokens": 9, "max_completion_tokens": 9}]
)
def test_max_tokens_aliases(tokenizer, fields):
    assert chat(tokenizer, **fields).max_tokens == 9


def test_json_object_and_text_formats(tokenizer):
    messages = [{"role": "user", "content": "count from 3 to 5 as json"}]  # json_object needs the word JSON
    parsed = chat(tokenizer, messages=messages, response_format={"type": "json_object"})
    assert parsed.response_format.type == "json_object"
    assert chat(tokenizer, response_format={"type": "text"}).response_format.schema is None


def test_null_means_absent(tokenizer):
    nulls = dict.fromkeys(["temperature", "top_p", "n", "stop", "seed", "logprobs", "max_tokens", "metadata", "stream"])
    assert chat(tokenizer, **nulls) == chat(tokenizer)


def test_known_fields_at_their_neutral_values_are_accepted(tokenizer):
    request = chat(
        tokenizer,
        stream=False,
        store=False,
        service_tier="auto",
        tool_choice="none",
        modalities=["text"],
        logit_bias={},
        parallel_tool_calls=True,
        prompt_cache_key="k",
        safety_identifier="s",
    )
    assert request == chat(tokenizer)


def test_a_prompt_that_exactly_fills_the_context_is_accepted(tokenizer):
    prompt_tokens = chat(tokenizer).prompt_tokens
    assert chat(tokenizer, max_tokens=CONTEXT - prompt_tokens).max_tokens == CONTEXT - prompt_tokens
    with pytest.raises(BodyError) as caught:
        chat(tokenizer, max_tokens=CONTEXT - prompt_tokens + 1)
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "max_tokens")


def test_completion_prompt_and_defaults(tokenizer):
    request = completion(tokenizer)
    assert request.kind == "completion"
    assert request.prompt_text == "count from 3 to 5 :"
    # Encoded as vLLM does for a completions prompt: with the tokenizer's special tokens.
    assert request.prompt_token_ids == tuple(tokenizer.encode(request.prompt_text, add_special_tokens=True))
    assert request.max_tokens == COMPLETIONS_DEFAULT_MAX_TOKENS
    assert (request.logprobs, request.top_logprobs, request.metadata) == (False, 0, None)


def test_completion_fields_are_honoured(tokenizer):
    request = completion(tokenizer, prompt=["one prompt"], max_tokens=5, logprobs=3, n=2, stop="x", seed=1, best_of=1)
    assert (request.prompt_text, request.max_tokens, request.logprobs, request.top_logprobs) == (
        "one prompt",
        5,
        True,
        3,
    )
    assert (request.n, request.stop, request.seed) == (2, ("x",), 1)
    assert completion(tokenizer, logprobs=0).logprobs is True  # 0 = the chosen tokens' logprobs, no alternatives


def test_completion_default_must_fit_the_context(tokenizer):
    prompt_tokens = completion(tokenizer).prompt_tokens
    assert completion(tokenizer, context=prompt_tokens + COMPLETIONS_DEFAULT_MAX_TOKENS).max_tokens == 16
    with pytest.raises(BodyError) as caught:
        completion(tokenizer, context=prompt_tokens + COMPLETIONS_DEFAULT_MAX_TOKENS - 1)
    assert (caught.value.code, caught.value.param) == ("context_length_exceeded", "prompt")
    # An explicit smaller limit fits where the default does not.
    assert completion(tokenizer, context=prompt_tokens + 2, max_tokens=2).max_tokens == 2


def test_a_template_that_refuses_the_conversation_is_a_line_error(strict_tokenizer):
    messages = [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}]
    with pytest.raises(BodyError) as caught:
        parse_chat_body({"model": "m", "messages": messages}, tokenizer=strict_tokenizer, context_length=CONTEXT)
    assert (caught.value.param, caught.value.code) == ("messages", "invalid_value")
    assert "system message must come first" in caught.value.message


def test_requests_are_values(tokenizer):
    assert chat(tokenizer, n=2) == chat(tokenizer, n=2)
    assert hash(chat(tokenizer, metadata={"a": "b"})) == hash(chat(tokenizer, metadata={"a": "b"}))
    with pytest.raises(AttributeError):
        chat(tokenizer).n = 3  # type: ignore[misc]


def test_a_line_whose_output_could_exceed_the_budget_is_refused(tokenizer):
    """n x max_tokens x (with logprobs) 2 + top_logprobs entries per token, against the per-line limit."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count"}], "max_tokens": 10, "n": 4}
    plain = parse_chat_body(body, tokenizer=tokenizer, context_length=CONTEXT, max_output_units=40)
    assert plain.output_units == 40
    with_logprobs = {**body, "logprobs": True, "top_logprobs": 3}
    with pytest.raises(BodyError) as caught:
        parse_chat_body(with_logprobs, tokenizer=tokenizer, context_length=CONTEXT, max_output_units=199)
    assert (caught.value.code, caught.value.param) == ("output_too_large", "max_tokens")
    assert "200" in caught.value.message and "199" in caught.value.message
    assert parse_chat_body(with_logprobs, tokenizer=tokenizer, context_length=CONTEXT, max_output_units=200).n == 4
    legacy = {"model": "tiny", "prompt": "count", "max_tokens": 10, "n": 2, "logprobs": 5}
    with pytest.raises(BodyError) as caught:
        parse_completion_body(legacy, tokenizer=tokenizer, context_length=CONTEXT, max_output_units=139)
    assert (caught.value.code, caught.value.param) == ("output_too_large", "max_tokens")
    assert parse_completion_body(legacy, tokenizer=tokenizer, context_length=CONTEXT, max_output_units=140).n == 2
