"""A chat body's ``messages`` → the conversation handed to the model's chat template.

- Roles system, developer, user and assistant; ``developer`` is ``system`` for the template (OpenAI's mapping
  for models without the role, and what templates know). ``tool``/``function`` messages, tool calls, images,
  audio and files are refused naming the field: this service runs no tools and reads only text.
- Content is a string or a list of ``{"type": "text", "text": ...}`` parts, joined with "\\n" as vLLM does
  for templates that take string content.
"""

from __future__ import annotations

from typing import Any

from controlplane.kinds.generation.fields import BodyError, missing, short, wrong_type

__all__ = ["chat_conversation"]

_ROLES = ("system", "developer", "user", "assistant")
_TEMPLATE_ROLE = {"developer": "system"}
_MESSAGE_KEYS = frozenset({"role", "content", "name"})
# Assistant-message fields that only carry tool calls, audio or refusals, none of which a template here renders.
_ASSISTANT_NOT_HONOURED = ("tool_calls", "function_call", "audio", "refusal")
_PART_KEYS = frozenset({"type", "text", "prompt_cache_breakpoint"})
_UNSUPPORTED_PARTS = {
    "image_url": "Image content is not supported by this service.",
    "input_audio": "Audio content is not supported by this service.",
    "file": "File content is not supported by this service.",
    "refusal": "Refusal content is not supported by this service.",
}


def chat_conversation(messages: Any) -> list[dict[str, str]]:
    """Raises only ``BodyError``; ``param`` is the path in the body (``messages[2].content[0].type``)."""
    if not isinstance(messages, list):
        raise wrong_type("messages", "an array", messages)
    if not messages:
        raise BodyError(
            "messages",
            "empty_array",
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        )
    return [_message(item, f"messages[{i}]") for i, item in enumerate(messages)]


def _message(message: Any, param: str) -> dict[str, str]:
    if not isinstance(message, dict):
        raise wrong_type(param, "an object", message)
    role = message.get("role")
    if role is None:
        raise missing(f"{param}.role")
    if role in ("tool", "function"):
        raise BodyError(
            f"{param}.role", "unsupported_value", f"'{role}' messages are not supported: tools are not supported."
        )
    if role not in _ROLES:
        raise BodyError(
            f"{param}.role",
            "invalid_value",
            f"Invalid value: {short(role)}. Supported values are: 'system', 'developer', 'user' and 'assistant'.",
        )
    for key, value in message.items():
        if key in _MESSAGE_KEYS:
            continue
        if role == "assistant" and key in _ASSISTANT_NOT_HONOURED:
            if value is None:
                continue
            raise BodyError(f"{param}.{key}", "unsupported_parameter", f"'{key}' is not supported in messages.")
        raise BodyError(f"{param}.{key}", "unknown_parameter", f"Unrecognized argument in a message: {short(key)}.")
    rendered: dict[str, str] = {
        "role": _TEMPLATE_ROLE.get(str(role), str(role)),
        "content": _content(message.get("content"), f"{param}.content"),
    }
    name = message.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise wrong_type(f"{param}.name", "a string", name)
        rendered["name"] = name
    return rendered


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
        unknown = sorted(set(part) - _PART_KEYS)
        if unknown:
            raise BodyError(
                f"{where}.{unknown[0]}", "unknown_parameter", f"Unrecognized argument: {short(unknown[0])}."
            )
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
