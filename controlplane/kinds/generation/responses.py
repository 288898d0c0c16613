"""A ``/v1/responses`` line's body (OpenAI's Responses API, CreateResponse) → a ``ResponsesRequest`` or a
``BodyError``. Pure, like bodies.py: the caller passes the model's tokenizer and context length.

A Responses body is translated into the chat body it means and parsed by bodies.parse_chat_body, so both
endpoints share one set of rules (chat template, context fit, sampling ranges, text format, output budget);
an error from the chat parser names the Responses field (``max_completion_tokens`` → ``max_output_tokens``,
``response_format.json_schema.schema`` → ``text.format.schema``, ``messages`` → ``input``).

Decisions (OpenAI's behaviour unless said otherwise):
- ``input`` is a string (one user message) or a list of message items: role user, assistant, system or
  developer; content a string or ``input_text`` parts (``output_text`` too in an assistant message, as a
  previous response's output item is sent back). ``instructions`` becomes a system message ahead of them.
- Only what a batch line can mean is taken. A line has no stored state, so ``previous_response_id``,
  ``conversation``, ``prompt`` (a stored prompt) and item references are refused; so is ``store: true`` (a
  batch line's response is in the output file and nowhere else: saying it was stored would be untrue), and
  ``background`` and ``stream`` (the whole response is written to the output file). Images, files, audio,
  reasoning settings and built-in tools are refused naming the field.
- Function tools are not supported on this endpoint yet: a non-empty ``tools`` is a 400; ``tool_choice``
  may be "none" or "auto" (with no tools, both mean a message).
- ``max_output_tokens`` is at least 16 (OpenAI's minimum); absent, the line may use what the context leaves.
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
    missing,
    read_integer,
    read_string,
    require,
    short,
    wrong_type,
)

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
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    format_description: str | None = None  # text.format.description of a json_schema format


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
    "include": ([],),
    "max_tool_calls": (),
    "tool_choice": ("none", "auto"),
    "top_logprobs": (0,),
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
    "include": "no additional output data is available (no tools, no logprobs in responses).",
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
    }
)
_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
_ROLES = ("user", "assistant", "system", "developer")
_STATUSES = ("in_progress", "completed", "incomplete")
_PART_KEYS = {
    "input_text": frozenset({"type", "text", "prompt_cache_breakpoint"}),
    "output_text": frozenset({"type", "text", "annotations", "logprobs"}),
}
_UNSUPPORTED_PARTS = {
    "input_image": "Image input is not supported by this service.",
    "input_file": "File input is not supported by this service.",
    "input_audio": "Audio input is not supported by this service.",
    "refusal": "Refusal content is not supported by this service.",
}
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
    ("Lower max_output_tokens, n or top_logprobs", "Lower max_output_tokens"),
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
    _check_tools(body.get("tools"))
    instructions = read_string(body, "instructions")
    messages, sources = _input_messages(require(body, "input"))
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
        sources.insert(0, "instructions")
    max_output_tokens = read_integer(body, "max_output_tokens", low=MIN_OUTPUT_TOKENS)
    text_format, description = _text_format(body.get("text"))
    chat_body = {
        "model": body.get("model"),
        "messages": messages,
        "max_completion_tokens": max_output_tokens,
        "response_format": text_format,
        **{name: body.get(name) for name in ("temperature", "top_p", "metadata", "user")},
        **{name: body.get(name) for name in ("safety_identifier", "prompt_cache_key", "parallel_tool_calls")},
    }
    try:
        request = parse_chat_body(
            chat_body, tokenizer=tokenizer, context_length=context_length, max_output_units=max_output_units
        )
    except BodyError as error:
        raise BodyError(responses_param(error.param, sources), error.code, _words(error.message)) from None
    echo = ResponseEcho(
        instructions=instructions,
        max_output_tokens=max_output_tokens,
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        safety_identifier=body.get("safety_identifier"),
        prompt_cache_key=body.get("prompt_cache_key"),
        format_description=description,
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


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise wrong_type("tools", "an array", tools)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise wrong_type(f"tools[{i}]", "an object", tool)
        kind = tool.get("type")
        if kind == "function":
            raise BodyError(
                "tools", "unsupported_value", "Function tools are not supported for /v1/responses batch lines yet."
            )
        raise BodyError(
            f"tools[{i}].type",
            "unsupported_value",
            f"Tool type {short(kind)} is not supported by this service (it runs no built-in tools).",
        )


def _input_messages(value: Any) -> tuple[list[dict[str, str]], list[str]]:
    """The chat messages ``input`` means, and for each the field it came from (``input``, ``input[3]``)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], ["input"]
    if not isinstance(value, list):
        raise wrong_type("input", "a string or an array of input items", value)
    if not value:
        raise BodyError(
            "input",
            "empty_array",
            "Invalid 'input': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        )
    messages = [_message(item, f"input[{i}]") for i, item in enumerate(value)]
    return messages, [f"input[{i}]" for i in range(len(value))]


def _message(item: Any, param: str) -> dict[str, str]:
    if not isinstance(item, dict):
        raise wrong_type(param, "an object", item)
    kind = item.get("type")
    if kind is not None and kind != "message":
        raise BodyError(f"{param}.type", *_item_type_refusal(kind))
    for key in item:
        if key not in _MESSAGE_KEYS:
            raise BodyError(
                f"{param}.{key}", "unknown_parameter", f"Unrecognized argument in an input item: {short(key)}."
            )
    role = item.get("role")
    if role is None:
        raise missing(f"{param}.role")
    if role not in _ROLES:
        raise BodyError(
            f"{param}.role",
            "invalid_value",
            f"Invalid value: {short(role)}. Supported values are: 'user', 'assistant', 'system' and 'developer'.",
        )
    status = item.get("status")
    if status is not None and status not in _STATUSES:
        raise BodyError(
            f"{param}.status",
            "invalid_value",
            f"Invalid value: {short(status)}. Supported values are: 'in_progress', 'completed' and 'incomplete'.",
        )
    item_id = item.get("id")
    if item_id is not None and not isinstance(item_id, str):
        raise wrong_type(f"{param}.id", "a string", item_id)
    return {"role": role, "content": _content(item.get("content"), f"{param}.content", role)}


def _item_type_refusal(kind: Any) -> tuple[str, str]:
    if kind == "item_reference":
        return "unsupported_value", "Item references are not supported: batch lines have no stored items."
    if kind == "reasoning":
        return "unsupported_value", "Reasoning items are not supported: these models do not reason."
    if isinstance(kind, str) and (kind.endswith("_call") or kind.endswith("_call_output")):
        return "unsupported_value", f"{short(kind)} items are not supported: tools are not supported here."
    return "invalid_value", f"Invalid value: {short(kind)}. Supported input item types: 'message'."


def _content(content: Any, param: str, role: str) -> str:
    if content is None:
        raise missing(param)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise wrong_type(param, "a string or an array of content parts", content)
    if not content:
        raise BodyError(param, "empty_array", f"Invalid '{param}': empty array. Expected at least one content part.")
    texts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise wrong_type(where, "an object", part)
        kind = part.get("type")
        if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:  # a list as type is unhashable
            raise BodyError(f"{where}.type", "unsupported_value", _UNSUPPORTED_PARTS[kind])
        allowed = ("input_text", "output_text") if role == "assistant" else ("input_text",)
        if not isinstance(kind, str) or kind not in allowed:
            names = " and ".join(f"'{name}'" for name in allowed)
            raise BodyError(
                f"{where}.type",
                "invalid_value",
                f"Invalid value: {short(kind)}. Supported content types in a {role} message: {names}.",
            )
        unknown = sorted(set(part) - _PART_KEYS[kind])
        if unknown:
            raise BodyError(
                f"{where}.{unknown[0]}", "unknown_parameter", f"Unrecognized argument: {short(unknown[0])}."
            )
        text = part.get("text")
        if text is None:
            raise missing(f"{where}.text")
        if not isinstance(text, str):
            raise wrong_type(f"{where}.text", "a string", text)
        texts.append(text)
    return "\n".join(texts)  # as messages.py joins a chat message's text parts


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
    unknown = sorted(set(spec) - _FORMAT_KEYS)
    if unknown:
        raise BodyError(
            f"text.format.{unknown[0]}", "unknown_parameter", f"Unrecognized argument: {short(unknown[0])}."
        )
    if spec.get("type") != "json_schema":
        return {"type": spec.get("type")}, None
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise wrong_type("text.format.description", "a string", description)
    inner = {name: spec.get(name) for name in ("name", "schema", "strict")}
    return {"type": "json_schema", "json_schema": inner}, description
