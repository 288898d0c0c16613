"""A generation line's body (``/v1/chat/completions``, ``/v1/completions``) → a ``GenerationRequest`` or a
``BodyError`` (a 400 line in the error file; the batch runs on). Pure: the caller passes the model's
tokenizer and context length, nothing here reads a database or the clock.

Decisions (OpenAI's behaviour unless said otherwise):
- ``max_tokens`` absent: chat gets what the context leaves (context - prompt), as OpenAI's chat does;
  completions get 16, the default in OpenAI's spec for the legacy endpoint. Either way prompt + max_tokens
  must fit the context, or the line is ``context_length_exceeded``.
- The engines take text and tokenize it with the tokenizer's special tokens (vLLM's default for a text prompt;
  the CPU engine does the same), so ``prompt_token_ids`` is always that encoding of ``prompt_text``: what the
  engine prefills, what usage counts. A chat template writes its own BOS; where the tokenizer adds one too
  (Llama 2/3), the template's is taken off the front of the text sent, so the prompt holds one BOS, not two.
- A completions ``prompt`` is one string (or a list of one). A list of several would make one line several
  requests with interleaved choices; a batch line is the unit of work, accounting and retry, so each prompt
  is its own line. Token-id arrays are refused: the engines take text (Triton's vLLM backend), and ids are
  only meaningful for one tokenizer.
- null means absent for every optional field, as OpenAI's API treats it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from controlplane.kinds.generation.fields import (
    INT64_MAX,
    INT64_MIN,
    PLAIN_TEXT,
    BodyError,
    ResponseFormat,
    check_unsupported,
    read_bool,
    read_integer,
    read_metadata,
    read_number,
    read_response_format,
    read_stop,
    read_string,
    require,
    short,
    wrong_type,
)
from controlplane.kinds.generation.messages import chat_conversation
from controlplane.kinds.generation.prompt import ChatTokenizer, chat_prompt
from controlplane.kinds.generation.schema import check_json_object_prompt, schema_compile_problem
from controlplane.kinds.generation.tools import (
    NO_TOOL_CHOICE,
    FunctionTool,
    ToolChoice,
    read_parallel_tool_calls,
    read_tool_choice,
    read_tools,
    tool_call_schema,
)

__all__ = [
    "BodyError",
    "ChatTokenizer",
    "FunctionTool",
    "GenerationRequest",
    "ResponseFormat",
    "ToolChoice",
    "parse_chat_body",
    "parse_completion_body",
]

MAX_CHOICES = 8  # n; OpenAI allows 128, but each choice is a sequence holding KV cache for the line's length
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's spec: CreateCompletionRequest.max_tokens default
MAX_TOP_LOGPROBS = 20  # chat
MAX_LEGACY_LOGPROBS = 5  # completions' integer `logprobs`


@dataclass(frozen=True)
class GenerationRequest:
    kind: Literal["chat", "completion"]
    model: str
    prompt_text: str  # after the chat template, for chat
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int = 0  # alternatives per position when logprobs is on (completions: its integer)
    response_format: ResponseFormat = PLAIN_TEXT
    user: str | None = None
    metadata: tuple[tuple[str, str], ...] | None = None
    # Chat only (tools.py): the functions the model may call, whether and which it must call, and whether it may
    # make several calls in one answer.
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice = NO_TOOL_CHOICE
    parallel_tool_calls: bool = True

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_units(self) -> int:
        """What the line can write at most, in tokens' worth of output: each choice's max_tokens tokens, and
        with logprobs one entry per token plus its top_logprobs alternatives (each about a token's JSON)."""
        per_token = 2 + self.top_logprobs if self.logprobs else 1
        return self.n * self.max_tokens * per_token


# Fields of OpenAI's request that the service does not honour, with the values that mean "not used" (null
# always does): any other value is a 400 naming the field rather than a result that silently differs.
CHAT_NOT_HONOURED: dict[str, tuple[Any, ...]] = {
    "stream": (False,),
    "stream_options": (),
    "functions": (),
    "function_call": ("none",),
    "logit_bias": ({},),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "web_search_options": (),
    "reasoning_effort": (),
    "verbosity": (),
    "store": (False,),  # stored completions are not kept
    "service_tier": ("auto", "default"),
    "moderation": (),
    "prompt_cache_retention": ("in_memory", "24h"),
    "prompt_cache_options": (),
}
# Accepted and checked but not acted on: they cannot change a completion (a cache-routing hint, an abuse-
# tracking id). Prefix caching here is automatic.
_CHAT_IGNORED = ("safety_identifier", "prompt_cache_key")
# What both endpoints honour (the sampling fields), then each endpoint's own.
_SHARED_HONOURED = frozenset(
    {
        "model",
        "max_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "user",
    }
)
CHAT_HONOURED = _SHARED_HONOURED | {
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "metadata",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    *_CHAT_IGNORED,
}
COMPLETION_NOT_HONOURED: dict[str, tuple[Any, ...]] = {
    "stream": (False,),
    "stream_options": (),
    "best_of": (1,),
    "echo": (False,),
    "logit_bias": ({},),
    "suffix": ("",),
}
COMPLETION_HONOURED = _SHARED_HONOURED | {"prompt"}


def parse_chat_body(
    body: Any, *, tokenizer: ChatTokenizer, context_length: int, max_output_units: int | None = None
) -> GenerationRequest:
    """A ``/v1/chat/completions`` body; raises only ``BodyError``. ``max_output_units``: the most a line may
    write (GenerationRequest.output_units), None for no limit."""
    fields = _body_object(body)
    check_unsupported(fields, CHAT_NOT_HONOURED, CHAT_HONOURED)
    read_string(fields, "safety_identifier", max_chars=64)  # OpenAI's limits and types
    read_string(fields, "prompt_cache_key")
    model = _model(fields)
    tools = read_tools(fields)
    tool_choice = read_tool_choice(fields, tools)
    conversation = chat_conversation(require(fields, "messages"))
    prompt_text = chat_prompt(tokenizer, conversation, tools)
    token_ids = tuple(tokenizer.encode(prompt_text, add_special_tokens=True))
    response_format = read_response_format(fields)
    check_json_object_prompt(response_format, [message["content"] for message in conversation])
    max_tokens, max_param = _chat_max_tokens(fields)
    logprobs = read_bool(fields, "logprobs")
    top_logprobs = read_integer(fields, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise BodyError("top_logprobs", "invalid_value", "Invalid 'top_logprobs': it requires 'logprobs' to be true.")
    request = GenerationRequest(
        kind="chat",
        model=model,
        prompt_text=prompt_text,
        prompt_token_ids=token_ids,
        max_tokens=_fit_context(len(token_ids), max_tokens, max_param, "messages", context_length, default=None),
        logprobs=logprobs,
        top_logprobs=top_logprobs or 0,
        response_format=response_format,
        metadata=read_metadata(fields),
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=read_parallel_tool_calls(fields),
        **_sampling(fields),
    )
    _check_call_grammar(request)
    return _within_output_budget(request, max_output_units, max_param)


def _check_call_grammar(request: GenerationRequest) -> None:
    """A forced call's grammar (tools.tool_call_schema) compiles: each function's parameters did, but their
    combination is what the engine gets."""
    schema = tool_call_schema(request.tools, request.tool_choice)
    if schema is None:
        return
    problem = schema_compile_problem(json.dumps(schema))
    if problem:
        raise BodyError("tool_choice", "invalid_value", f"The call's grammar cannot be compiled: {problem[:300]}")


def parse_completion_body(
    body: Any, *, tokenizer: ChatTokenizer, context_length: int, max_output_units: int | None = None
) -> GenerationRequest:
    """A ``/v1/completions`` body; raises only ``BodyError`` (``max_output_units`` as parse_chat_body's)."""
    fields = _body_object(body)
    check_unsupported(fields, COMPLETION_NOT_HONOURED, COMPLETION_HONOURED)
    model = _model(fields)
    prompt_text = _prompt(require(fields, "prompt"))
    token_ids = tuple(tokenizer.encode(prompt_text, add_special_tokens=True))
    legacy_logprobs = read_integer(fields, "logprobs", low=0, high=MAX_LEGACY_LOGPROBS)
    max_tokens = read_integer(fields, "max_tokens", low=1)
    request = GenerationRequest(
        kind="completion",
        model=model,
        prompt_text=prompt_text,
        prompt_token_ids=token_ids,
        max_tokens=_fit_context(
            len(token_ids), max_tokens, "max_tokens", "prompt", context_length, default=COMPLETIONS_DEFAULT_MAX_TOKENS
        ),
        logprobs=legacy_logprobs is not None,
        top_logprobs=legacy_logprobs or 0,
        **_sampling(fields),
    )
    return _within_output_budget(request, max_output_units, "max_tokens")


def _within_output_budget(request: GenerationRequest, limit: int | None, max_param: str) -> GenerationRequest:
    """The request, unless it could write more than ``limit`` (n x max_tokens x the entries per token): such a
    line (n 8, top_logprobs 20, a whole context of max_tokens) writes tens of MB, more than its shard's worker
    should hold or its tenant's storage estimate counts."""
    if limit is None or request.output_units <= limit:
        return request
    entries = f" x {2 + request.top_logprobs} (each token, its logprob and {request.top_logprobs} alternatives)"
    raise BodyError(
        # The field to change: the one the request set among those that multiply.
        max_param,
        "output_too_large",
        f"This line could write up to {request.output_units} tokens' worth of output (n {request.n} x "
        f"{max_param} {request.max_tokens}{entries if request.logprobs else ''}), over the limit of {limit} per "
        f"line. Lower {max_param}, n or top_logprobs, or split the request into several lines.",
    )


def _body_object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise BodyError(None, "invalid_type", f"The request body must be a JSON object, got {short(body)}.")
    return body


def _model(fields: Mapping[str, Any]) -> str:
    model = require(fields, "model")
    if not isinstance(model, str) or not model:
        raise wrong_type("model", "a non-empty string", model)
    return model


class _Sampling(TypedDict):
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    n: int
    presence_penalty: float
    frequency_penalty: float
    user: str | None


def _sampling(fields: Mapping[str, Any]) -> _Sampling:
    """The fields both endpoints share, with OpenAI's ranges (top_p > 0: the engines refuse 0)."""
    return {
        "temperature": read_number(fields, "temperature", default=1.0, low=0.0, high=2.0),
        "top_p": read_number(fields, "top_p", default=1.0, low=0.0, high=1.0, low_open=True),
        "seed": read_integer(fields, "seed", low=INT64_MIN, high=INT64_MAX),
        "stop": read_stop(fields),
        "n": read_integer(fields, "n", low=1, high=MAX_CHOICES) or 1,
        "presence_penalty": read_number(fields, "presence_penalty", default=0.0, low=-2.0, high=2.0),
        "frequency_penalty": read_number(fields, "frequency_penalty", default=0.0, low=-2.0, high=2.0),
        "user": read_string(fields, "user"),
    }


def _chat_max_tokens(fields: Mapping[str, Any]) -> tuple[int | None, str]:
    """``max_completion_tokens`` is the current name, ``max_tokens`` the deprecated alias: one, or both equal."""
    legacy = read_integer(fields, "max_tokens", low=1)
    current = read_integer(fields, "max_completion_tokens", low=1)
    if legacy is not None and current is not None and legacy != current:
        raise BodyError(
            "max_completion_tokens",
            "invalid_value",
            f"'max_tokens' ({legacy}) and 'max_completion_tokens' ({current}) are aliases and disagree; "
            "give one of them.",
        )
    if current is not None:
        return current, "max_completion_tokens"
    return legacy, "max_tokens"


def _fit_context(
    prompt_tokens: int, requested: int | None, max_param: str, prompt_param: str, context: int, *, default: int | None
) -> int:
    """max_tokens for the line: ``requested``, else ``default``, else what the context leaves; the total must fit."""
    if prompt_tokens == 0:
        raise BodyError(prompt_param, "invalid_value", f"'{prompt_param}' is empty after tokenization.")
    max_tokens = requested if requested is not None else default if default is not None else context - prompt_tokens
    if prompt_tokens + max(max_tokens, 1) > context:
        noun = "messages" if prompt_param == "messages" else "prompt"
        raise BodyError(
            # The field to change: the prompt when it leaves no room at all, else the limit that was asked for.
            max_param if requested is not None and prompt_tokens < context else prompt_param,
            "context_length_exceeded",
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt_tokens + max(max_tokens, 1)} tokens ({prompt_tokens} in the {noun}, {max(max_tokens, 1)} "
            f"in the completion). Please reduce the length of the {noun} or completion.",
        )
    return max_tokens


def _prompt(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        if len(value) > 1:
            raise BodyError(
                "prompt",
                "unsupported_value",
                f"'prompt' holds {len(value)} prompts; this service takes one prompt per batch line "
                "(send each as its own line).",
            )
        value = value[0]
    elif isinstance(value, list) and value and all(isinstance(item, (int, list)) for item in value):
        raise BodyError("prompt", "unsupported_value", "Token-id prompts are not supported; send the prompt as text.")
    if not isinstance(value, str):
        raise wrong_type("prompt", "a string or an array of one string", value)
    if not value:
        raise BodyError("prompt", "invalid_value", "'prompt' must not be empty.")
    return value
