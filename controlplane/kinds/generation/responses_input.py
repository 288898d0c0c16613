"""A Responses body's ``input``, ``tools`` and ``tool_choice`` → the chat body's ``messages``, ``tools`` and
``tool_choice`` they mean (responses.py hands the result to bodies.parse_chat_body, which checks the rest).

- ``input``: a string (one user message) or a list of items. A ``message`` item (``type`` "message" or absent:
  role user, assistant, system or developer; content a string or ``input_text`` parts, ``output_text`` parts too
  in an assistant message) is a chat message, its parts chat's text parts. ``function_call`` items are the
  ``tool_calls`` of an assistant message (consecutive calls, or calls after an assistant message, are one turn, as
  OpenAI reads them); a ``function_call_output`` item is a ``tool`` message answering an earlier call's
  ``call_id``. Every other item type (item references, reasoning, built-in tools' calls) is refused naming it.
- ``tools``: function tools ``{"type": "function", "name", "description"?, "parameters", "strict"}`` → chat's
  ``{"type": "function", "function": {...}}``; built-in tools are refused naming the tool's ``type``.
- ``tool_choice``: "none", "auto", "required" or ``{"type": "function", "name"}``; without tools "none" and "auto"
  both mean a message (OpenAI's default is "auto", chat's refuses it without tools).

Each chat message keeps the field it came from (``sources``), so an error of the chat parser names the input item.
"""

from __future__ import annotations

from typing import Any

from controlplane.kinds.generation.fields import (
    BodyError,
    check_array_length,
    missing,
    required_string,
    short,
    wrong_type,
)

__all__ = ["chat_tool_choice", "chat_tools", "input_messages"]

_MESSAGE_KEYS = frozenset({"type", "role", "content", "id", "status"})
_CALL_KEYS = frozenset({"type", "id", "call_id", "name", "arguments", "status"})
_CALL_OUTPUT_KEYS = frozenset({"type", "id", "call_id", "output", "status"})
_ROLES = ("user", "assistant", "system", "developer")
_STATUSES = ("in_progress", "completed", "incomplete")
_UNSUPPORTED_PARTS = {
    "input_image": "Image input is not supported by this service.",
    "input_file": "File input is not supported by this service.",
    "input_audio": "Audio input is not supported by this service.",
    "refusal": "Refusal content is not supported by this service.",
}
_OUTPUT_TEXT_EXTRAS = ("annotations", "logprobs")  # what a previous response's output_text part carries besides text
_FUNCTION_TOOL_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})
# FunctionTool fields that configure OpenAI's tool search or callers: null, or refused.
_FUNCTION_TOOL_NOT_HONOURED = ("output_schema", "defer_loading", "allowed_callers")


def input_messages(value: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages ``input`` means, and for each the field it came from (``input``, ``input[3]``)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}], ["input"]
    if not isinstance(value, list):
        raise wrong_type("input", "a string or an array of input items", value)
    check_array_length("input", value)
    messages: list[dict[str, Any]] = []
    sources: list[str] = []
    calls: set[str] = set()  # the call ids so far: what a function_call_output may answer
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise wrong_type(param, "an object", item)
        kind = item.get("type")
        if kind == "function_call":
            call = _function_call(item, param)
            calls.add(call["id"])
            previous = messages[-1] if messages else None
            if previous is not None and previous["role"] == "assistant":
                previous.setdefault("tool_calls", []).append(call)
                continue
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_function_call_output(item, param, calls))
        elif kind is None or kind == "message":
            messages.append(_message(item, param))
        else:
            raise BodyError(f"{param}.type", *_item_type_refusal(kind))
        sources.append(param)
    return messages, sources


def _item_type_refusal(kind: Any) -> tuple[str, str]:
    if kind == "item_reference":
        return "unsupported_value", "Item references are not supported: batch lines have no stored items."
    if kind == "reasoning":
        return "unsupported_value", "Reasoning items are not supported: these models do not reason."
    if isinstance(kind, str) and (kind.endswith("_call") or kind.endswith("_call_output")):
        return "unsupported_value", f"{short(kind)} items are not supported: this service runs no built-in tools."
    return (
        "invalid_value",
        f"Invalid value: {short(kind)}. Supported input item types: 'message', 'function_call' and "
        "'function_call_output'.",
    )


def _message(item: dict[str, Any], param: str) -> dict[str, Any]:
    _known_keys(item, _MESSAGE_KEYS, param)
    role = item.get("role")
    if role is None:
        raise missing(f"{param}.role")
    if role not in _ROLES:
        raise BodyError(
            f"{param}.role",
            "invalid_value",
            f"Invalid value: {short(role)}. Supported values are: 'user', 'assistant', 'system' and 'developer'.",
        )
    _status_and_id(item, param)
    return {"role": role, "content": _content(item.get("content"), f"{param}.content", role)}


def _content(content: Any, param: str, role: str) -> Any:
    """A string as it is; parts as chat's text parts (chat's parser checks their text and keys)."""
    if not isinstance(content, list):
        return content
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            parts.append(part)
            continue
        kind = part.get("type")
        where = f"{param}[{j}].type"
        if isinstance(kind, str) and kind in _UNSUPPORTED_PARTS:  # a list as type is unhashable
            raise BodyError(where, "unsupported_value", _UNSUPPORTED_PARTS[kind])
        allowed = ("input_text", "output_text") if role == "assistant" else ("input_text",)
        if not isinstance(kind, str) or kind not in allowed:
            names = " and ".join(f"'{name}'" for name in allowed)
            raise BodyError(
                where, "invalid_value", f"Invalid value: {short(kind)}. Supported content types in a {role} "
                f"message: {names}."
            )  # fmt: skip
        extras = _OUTPUT_TEXT_EXTRAS if kind == "output_text" else ()
        parts.append({**{k: v for k, v in part.items() if k not in extras}, "type": "text"})
    return parts


def _function_call(item: dict[str, Any], param: str) -> dict[str, Any]:
    _known_keys(item, _CALL_KEYS, param)
    _status_and_id(item, param)
    call_id, name, arguments = (required_string(item, key, param) for key in ("call_id", "name", "arguments"))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_call_output(item: dict[str, Any], param: str, calls: set[str]) -> dict[str, Any]:
    _known_keys(item, _CALL_OUTPUT_KEYS, param)
    _status_and_id(item, param)
    call_id = required_string(item, "call_id", param)
    if call_id not in calls:
        raise BodyError(
            f"{param}.call_id",
            "invalid_value",
            f"Invalid '{param}.call_id': {short(call_id)} answers no function_call item before it.",
        )
    output = item.get("output")
    if output is None:
        raise missing(f"{param}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": _content(output, f"{param}.output", "tool")}


def _known_keys(item: dict[str, Any], known: frozenset[str], param: str) -> None:
    for key in item:
        if key not in known:
            raise BodyError(f"{param}.{key}", "unknown_parameter", f"Unrecognized argument: {short(key)}.")


def _status_and_id(item: dict[str, Any], param: str) -> None:
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


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses' function tools as chat's (None for none: chat refuses an empty list, Responses takes one)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise wrong_type("tools", "an array", tools)
    translated = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise wrong_type(param, "an object", tool)
        kind = tool.get("type")
        if kind is None:
            raise missing(f"{param}.type")
        if kind != "function":
            raise BodyError(
                f"{param}.type",
                "unsupported_value",
                f"Tool type {short(kind)} is not supported by this service (it runs no built-in tools); "
                "use function tools.",
            )
        for key, value in tool.items():
            if key in _FUNCTION_TOOL_NOT_HONOURED and value is not None:
                raise BodyError(f"{param}.{key}", "unsupported_parameter", f"'{key}' is not supported in tools.")
            if key not in _FUNCTION_TOOL_KEYS and key not in _FUNCTION_TOOL_NOT_HONOURED:
                raise BodyError(f"{param}.{key}", "unknown_parameter", f"Unrecognized argument: {short(key)}.")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        translated.append({"type": "function", "function": function})
    return translated or None


def chat_tool_choice(value: Any, *, has_tools: bool) -> Any:
    """Responses' ``tool_choice`` as chat's."""
    if not has_tools and value in (None, "none", "auto"):
        return None
    if isinstance(value, dict):
        kind = value.get("type")
        if kind != "function":
            if kind is None:
                raise missing("tool_choice.type")
            raise BodyError(
                "tool_choice.type",
                "unsupported_value",
                f"tool_choice of type {short(kind)} is not supported; use 'none', 'auto', 'required' or a function.",
            )
        _known_keys(value, frozenset({"type", "name"}), "tool_choice")
        return {"type": "function", "function": {"name": value.get("name")}}
    return value
