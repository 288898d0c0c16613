"""A ``/v1/responses`` line's body (OpenAI's Responses API, CreateResponse) → a ``ResponsesRequest`` or a
``BodyError``. Pure, like bodies.py: the caller passes the model's tokenizer and context length.

A Responses body is translated into the chat body it means and parsed by bodies.parse_chat_body, so both
endpoints share one set of rules (chat template, context fit, sampling ranges, text format, output budget);
an error from the chat parser names the Responses field (``max_completion_tokens`` → ``max_output_tokens``,
``response_format.json_schema.schema`` → ``text.format.schema``, ``messages`` → ``input``).

Decisions (OpenAI's behaviour unless said otherwise):
- ``input`` (message items, function calls and their outputs), ``tools`` and ``tool_choice`` are translated in
  responses_input.py; ``instructions`` becomes a system message ahead of the input.
- Only what a batch line can mean is taken. A line has no stored state, so ``previous_response_id``,
  ``conversation``, ``prompt`` (a stored prompt) and item references are refused; so is ``store: true`` (a
  batch line's response is in the output file and nowhere else: saying it was stored would be untrue), and
  ``background`` and ``stream`` (the whole response is written to the output file). Images, files, audio,
  reasoning settings and built-in tools are refused naming the field.
- ``max_output_tokens`` is at least 16 (OpenAI's minimum); absent, the line may use what the context leaves.
- Logprobs come back when ``include`` holds ``message.output_text.logprobs`` (the only value with anything to
  include here), with ``top_logprobs`` alternatives per token, on each ``output_text`` part, as OpenAI does.
- The fields echoed in the response that the request does not hold otherwise (instructions, the requested
  max_output_tokens, ...) ride along on the request (``ResponsesRequest.echo``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.kinds.generation.bodies import ChatTokenizer, GenerationRequest, parse_chat_body
from controlplane.kinds.generation.fields import (
    BodyError,
    check_unsupported,
    read_integer,
    read_string,
    refuse_unknown_keys,
    require,
    short,
    wrong_type,
)
from controlplane.kinds.generation.responses_input import chat_tool_choice, chat_tools, input_messages

__all__ = [
    "RESPONSES_HONOURED",
    "RESPONSES_NOT_HONOURED",
    "ResponseEcho",
    "ResponsesRequest",
    "parse_responses_body",
    "responses_param",
]

MIN_OUTPUT_TOKENS = 16  # OpenAI's spec: CreateResponse.max_output_tokens minimum


@dataclass(frozen=True)
class ResponseEcho:
    """What the Response object repeats from its request and GenerationRequest does not keep."""

    instructions: str | None = None
    max_output_tokens: int | None = None  # as requested (None: what the context leaves)
    tool_choice: str = "auto"  # as sent, when the line has no tools ("none" or "auto": both mean a message)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    format_description: str | None = None  # text.format.description of a json_schema format
    top_logprobs: int = 0  # as requested (returned only with `include` of message.output_text.logprobs)


@dataclass(frozen=True)
class ResponsesRequest(GenerationRequest):
    echo: ResponseEcho = ResponseEcho()


# Fields of CreateResponse that the service does not honour, with the values that mean "not used" (null always
# does), as bodies.CHAT_NOT_HONOURED. Those a tenant might expect to work get their reason in _REASONS.
RESPONSES_NOT_HONOURED: dict[str, tuple[Any, ...]] = {
    "background": (False,),
    "conversation": (),
    "previous_response_id": (),
    "prompt": (),
    "store": (False,),
    "stream": (False,),
    "stream_options": (),
    "reasoning": ({},),
    "max_tool_calls": (),
    "truncation": ("disabled",),
    "service_tier": ("auto", "default"),
    "prompt_cache_retention": ("in_memory", "24h"),
    "prompt_cache_options": (),
    "context_management": (),
    "moderation": (),
}
_REASONS = {
    "previous_response_id": "batch lines have no stored responses to continue from; send the earlier turns in 'input'.",
    "conversation": "batch lines have no stored conversations; send the earlier turns in 'input'.",
    "prompt": "stored prompts are not available to batch lines; send the text in 'instructions' and 'input'.",
    "store": "a batch line's response is written to the batch's output file and not stored; use false or omit it.",
    "background": "a batch line already runs in the background; omit it.",
    "stream": "a batch writes the whole response to the output file; omit it.",
    "reasoning": "these models do not reason before answering.",
}
RESPONSES_HONOURED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "parallel_tool_calls",
        "tools",
        "tool_choice",
        "include",
        "top_logprobs",
    }
)
LOGPROBS = "message.output_text.logprobs"  # the one `include` value with something to include here
MAX_TOP_LOGPROBS = 20
_FORMAT_KEYS = frozenset({"type", "name", "schema", "strict", "description"})
# The chat parser's names → the Responses body's (longest first: a prefix is replaced once).
_PARAMS = (
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),  # the chat parser's name for the limit when none was given
)
_MESSAGE_WORDS = (
    *_PARAMS,
    ("Lower max_output_tokens, n or top_logprobs", "Lower max_output_tokens or top_logprobs"),
    ("'messages'", "'input'"),
    ("the messages", "the input"),
)


def parse_responses_body(
    body: Any, *, tokenizer: ChatTokenizer, context_length: int, max_output_units: int | None = None
) -> ResponsesRequest:
    """A ``/v1/responses`` body; raises only ``BodyError`` (``max_output_units`` as parse_chat_body's)."""
    if not isinstance(body, dict):
        raise BodyError(None, "invalid_type", f"The request body must be a JSON object, got {short(body)}.")
    _refuse_with_reason(body)
    check_unsupported(body, RESPONSES_NOT_HONOURED, RESPONSES_HONOURED)
    instructions = read_string(body, "instructions")
    messages, sources = input_messages(require(body, "input"))
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
        sources.insert(0, "instructions")
    max_output_tokens = read_integer(body, "max_output_tokens", low=MIN_OUTPUT_TOKENS)
    text_format, description = _text_format(body.get("text"))
    tools = chat_tools(body.get("tools"))
    logprobs = _include_logprobs(body.get("include"))
    top_logprobs = read_integer(body, "top_logprobs", low=0, high=MAX_TOP_LOGPROBS)
    chat_body = {
        "model": body.get("model"),
        "messages": messages,
        "max_completion_tokens": max_output_tokens,
        "response_format": text_format,
        "tools": tools,
        "tool_choice": chat_tool_choice(body.get("tool_choice"), has_tools=tools is not None),
        # OpenAI returns logprobs only when `include` asks; top_logprobs alone changes nothing.
        "logprobs": logprobs or None,
        "top_logprobs": top_logprobs if logprobs and top_logprobs else None,
        **{name: body.get(name) for name in ("temperature", "top_p", "metadata", "user")},
        **{name: body.get(name) for name in ("safety_identifier", "prompt_cache_key", "parallel_tool_calls")},
    }
    try:
        request = parse_chat_body(
            chat_body, tokenizer=tokenizer, context_length=context_length, max_output_units=max_output_units
        )
    except BodyError as error:
        param = responses_param(error.param, sources)
        message = error.message.replace(error.param, param) if error.param and param else error.message
        raise BodyError(param, error.code, _words(message)) from None
    echo = ResponseEcho(
        instructions=instructions,
        max_output_tokens=max_output_tokens,
        tool_choice="none" if body.get("tool_choice") == "none" else "auto",
        safety_identifier=body.get("safety_identifier"),
        prompt_cache_key=body.get("prompt_cache_key"),
        format_description=description,
        top_logprobs=top_logprobs or 0,
    )
    fields = {field.name: getattr(request, field.name) for field in dataclasses.fields(GenerationRequest)}
    return ResponsesRequest(**fields, echo=echo)


def responses_param(param: str | None, sources: list[str] | None = None) -> str | None:
    """A chat body's field path → the Responses body's: ``messages[k]...`` → the input item (or instructions)
    message k was made of, when ``sources`` says, else ``input``."""
    if param is None:
        return None
    if param.startswith("messages"):
        rest = param[len("messages") :]
        if sources is not None and rest.startswith("["):
            index, _, tail = rest[1:].partition("]")
            if index.isdigit() and int(index) < len(sources):
                return sources[int(index)] + tail
        return "input"
    if param.startswith("tools[") and ".function" in param:  # tools[i].function.name → tools[i].name
        return param.replace(".function", "", 1)
    if param.startswith("tool_choice.function"):
        return "tool_choice" + param[len("tool_choice.function") :]
    for chat, responses in _PARAMS:
        if param == chat or param.startswith(chat + "."):
            return responses + param[len(chat) :]
    return param


def _words(message: str) -> str:
    for chat, responses in _MESSAGE_WORDS:
        message = message.replace(chat, responses)
    return message


def _refuse_with_reason(body: Mapping[str, Any]) -> None:
    for name, reason in _REASONS.items():
        value = body.get(name)
        neutral = RESPONSES_NOT_HONOURED[name]
        if value is None or any(value == ok and type(value) is type(ok) for ok in neutral):
            continue
        code = "unsupported_value" if neutral else "unsupported_parameter"
        raise BodyError(name, code, f"'{name}' is not supported here (got {short(value)}): {reason}")


def _include_logprobs(include: Any) -> bool:
    """Whether ``include`` asks for the output text's logprobs; any other value is refused naming it."""
    if include is None:
        return False
    if not isinstance(include, list):
        raise wrong_type("include", "an array", include)
    for i, value in enumerate(include):
        if value != LOGPROBS:
            raise BodyError(
                f"include[{i}]",
                "unsupported_value",
                f"include {short(value)} is not supported here: the only output data to include is "
                f"'{LOGPROBS}' (no built-in tools, images or reasoning).",
            )
    return bool(include)


def _text_format(text: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``text`` → the chat body's ``response_format`` (the same rules then apply), and a json_schema format's
    description for the echo."""
    if text is None:
        return None, None
    if not isinstance(text, dict):
        raise wrong_type("text", "an object", text)
    for key, value in text.items():
        if key == "verbosity":
            if value is not None:
                raise BodyError(
                    "text.verbosity", "unsupported_value", f"'text.verbosity' is not supported (got {short(value)})."
                )
        elif key != "format":
            raise BodyError(f"text.{key}", "unknown_parameter", f"Unrecognized argument: {short(key)}.")
    spec = text.get("format")
    if spec is None:
        return None, None
    if not isinstance(spec, dict):
        raise wrong_type("text.format", "an object", spec)
    refuse_unknown_keys(spec, _FORMAT_KEYS, "text.format")
    if spec.get("type") != "json_schema":
        return {"type": spec.get("type")}, None
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise wrong_type("text.format.description", "a string", description)
    inner = {name: spec.get(name) for name in ("name", "schema", "strict")}
    return {"type": "json_schema", "json_schema": inner}, description
