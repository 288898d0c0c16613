"""A chat body's ``messages`` → the conversation handed to the model's chat template.

- Roles system, developer, user, assistant and tool; ``developer`` is ``system`` for the template (OpenAI's
  mapping for models without the role, and what templates know). Legacy ``function`` messages, images, audio
  and files are refused naming the field: this service reads only text.
- Content is a string or a list of ``{"type": "text", "text": ...}`` parts, joined with "\\n" as vLLM does
  for templates that take string content.
- Tool calls in the history take transformers' convention for chat templates: an assistant message keeps its
  ``tool_calls`` (``{"id", "type": "function", "function": {"name", "arguments"}}``, the arguments parsed from
  their JSON text into an object, as vLLM hands them to templates; text that is not JSON stays text), its
  content "" when null; a ``tool`` message keeps its ``tool_call_id``, which must answer a call of an earlier
  assistant message. Templates that do not know tools get them in the Hermes format (tool_format.py).
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.kinds.generation.fields import (
    BodyError,
    check_array_length,
    missing,
    refuse_unknown_keys,
    required_string,
    short,
    wrong_type,
)

__all__ = ["chat_conversation"]

_ROLES = ("system", "developer", "user", "assistant", "tool")
_TEMPLATE_ROLE = {"developer": "system"}
_MESSAGE_KEYS = frozenset({"role", "content", "name"})
_TOOL_MESSAGE_KEYS = frozenset({"role", "content", "tool_call_id"})
# Assistant-message fields that only carry legacy function calls, audio or refusals: null, or refused.
_ASSISTANT_NOT_HONOURED = ("function_call", "audio", "refusal")
_CALL_KEYS = frozenset({"id", "type", "function"})
_CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})
_PART_KEYS = frozenset({"type", "text", "prompt_cache_breakpoint"})
_UNSUPPORTED_PARTS = {
    "image_url": "Image content is not supported by this service.",
    "input_audio": "Audio content is not supported by this service.",
    "file": "File content is not supported by this service.",
    "refusal": "Refusal content is not supported by this service.",
}


def chat_conversation(messages: Any) -> list[dict[str, Any]]:
    """Raises only ``BodyError``; ``param`` is the path in the body (``messages[2].content[0].type``)."""
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    check_array_length("messages", messages)
    call_ids: set[str] = set()  # the ids of the calls made so far: what a tool message may answer
    conversation = []
    for i, item in enumerate(messages):
        message = _message(item, f"messages[{i}]", call_ids)
        call_ids.update(call["id"] for call in message.get("tool_calls", ()))
        conversation.append(message)
    return conversation


def _message(message: Any, param: str, call_ids: set[str]) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise wrong_type(param, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing(f"{param}.role")
    if role == "function":
        raise BodyError(
            f"{param}.role",
            "unsupported_value",
            "'function' messages (the legacy function-calling format) are not supported; answer calls with "
            "'tool' messages.",
        )
    if role not in _ROLES:
        raise BodyError(
            f"{param}.role",
            "invalid_value",
            f"Invalid value: {short(role)}. Supported values are: 'system', 'developer', 'user', 'assistant' and "
            "'tool'.",
        )
    if role == "tool":
        return _tool_message(message, param, call_ids)
    for key, value in message.items():
        if key in _MESSAGE_KEYS or (role == "assistant" and key == "tool_calls"):
            continue
        if role == "assistant" and key in _ASSISTANT_NOT_HONOURED:
            if value is None:
                continue
            raise BodyError(f"{param}.{key}", "unsupported_parameter", f"'{key}' is not supported in messages.")
        raise BodyError(f"{param}.{key}", "unknown_parameter", f"Unrecognized argument in a message: {short(key)}.")
    calls = _tool_calls(message.get("tool_calls"), f"{param}.tool_calls") if role == "assistant" else None
    content = message.get("content")
    rendered: dict[str, Any] = {
        "role": _TEMPLATE_ROLE.get(str(role), str(role)),
        "content": "" if content is None and calls else _content(content, f"{param}.content"),
    }
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise wrong_type(f"{param}.name", "a string", name)
        rendered["name"] = name
    if calls:
        rendered["tool_calls"] = calls
    return rendered


def _tool_message(message: dict[str, Any], param: str, call_ids: set[str]) -> dict[str, Any]:
    unknown = sorted(set(message) - _TOOL_MESSAGE_KEYS)
    if unknown:
        raise BodyError(
            f"{param}.{unknown[0]}", "unknown_parameter", f"Unrecognized argument in a message: {short(unknown[0])}."
        )
    call_id = message.get("tool_call_id")
    if call_id is None:
        raise missing(f"{param}.tool_call_id")
    if not isinstance(call_id, str):
        raise wrong_type(f"{param}.tool_call_id", "a string", call_id)
    if call_id not in call_ids:
        raise BodyError(
            f"{param}.tool_call_id",
            "invalid_value",
            f"Invalid '{param}.tool_call_id': {short(call_id)} answers no tool call of an earlier assistant message "
            "(a 'tool' message must follow the assistant message whose 'tool_calls' has that id).",
        )
    return {"role": "tool", "content": _content(message.get("content"), f"{param}.content"), "tool_call_id": call_id}


def _tool_calls(value: Any, param: str) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise wrong_type(param, "an array", value)
    check_array_length(param, value)
    return [_tool_call(call, f"{param}[{j}]") for j, call in enumerate(value)]


def _tool_call(call: Any, param: str) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise wrong_type(param, "an object", call)
    refuse_unknown_keys(call, _CALL_KEYS, param)
    kind = call.get("type")
    if kind is None:
        raise missing(f"{param}.type")
    if kind != "function":
        raise BodyError(
            f"{param}.type", "invalid_value", f"Invalid value: {short(kind)}. Supported values are: 'function'."
        )
    call_id = required_string(call, "id", param)
    function = call.get("function")
    if function is None:
        raise missing(f"{param}.function")
    if not isinstance(function, dict):
        raise wrong_type(f"{param}.function", "an object", function)
    refuse_unknown_keys(function, _CALL_FUNCTION_KEYS, f"{param}.function")
    name = required_string(function, "name", f"{param}.function")
    arguments = required_string(function, "arguments", f"{param}.function")
    try:
        parsed: Any = json.loads(arguments)
    except ValueError:
        parsed = arguments  # the model's text as it was: the template shows it as given
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def _content(content: Any, param: str) -> str:
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
        if kind != "text":
            raise BodyError(
                f"{where}.type", "invalid_value", f"Invalid value: {short(kind)}. Supported content part types: 'text'."
            )
        refuse_unknown_keys(part, _PART_KEYS, where)
        if part.get("prompt_cache_breakpoint") not in (None, {"mode": "explicit"}):
            raise BodyError(
                f"{where}.prompt_cache_breakpoint",
                "invalid_value",
                'prompt_cache_breakpoint must be {"mode": "explicit"}.',
            )
        text = part.get("text")
        if text is None:
            raise missing(f"{where}.text")
        if not isinstance(text, str):
            raise wrong_type(f"{where}.text", "a string", text)
        texts.append(text)
    return "\n".join(texts)
