"""Tool calling on chat lines (OpenAI's function tools): the body's ``tools``, ``tool_choice`` and
``parallel_tool_calls`` → ``FunctionTool``/``ToolChoice`` on the GenerationRequest; the JSON schema a forced call
is decoded under; what the engine's text becomes (``ToolCall``s or content) and the calls' ids.

- ``tools``: 1..128 ``{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}``.
  Names match ``^[a-zA-Z0-9_-]{1,64}$`` and are unique; ``parameters`` is a valid Draft 2020-12 schema of an
  object that the engine's decoding library compiles (schema.py), else a 400 naming
  ``tools[i].function.parameters``. No ``parameters``: a function without arguments (``{}``), as OpenAI reads it.
  Custom tools and ``allowed_tools`` choices are refused naming the field.
- ``tool_choice``: absent means "auto" with tools, "none" without (OpenAI's default); "auto", "required" or a
  named function need ``tools``, and a named function must be one of them.
- "required" and a named function are **decoded under a grammar**: the call's JSON,
  ``{"name": <one of the allowed names>, "arguments": <that function's parameters>}`` (``anyOf`` over the
  functions; objects that list their properties closed to others), sent as the engine's guided-decoding schema
  (engine.py), so the arguments always validate. One call per choice, whatever ``parallel_tool_calls`` says: an
  array of calls lets a small model repeat calls until max_tokens. "auto" decodes freely and a parser per format
  (tool_format.py) finds the calls in the text; with ``parallel_tool_calls`` false only the first is kept.
- Call ids are ``call_`` + 24 hex characters of a digest of the completion's id (itself the output line's request
  id) and the call's position: a line regenerated after a retry writes the same ids.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from referencing.exceptions import Unresolvable

from controlplane.core.jsontext import MAX_JSON_DEPTH
from controlplane.kinds.generation.fields import (
    BodyError,
    check_array_length,
    missing,
    refuse_unknown_keys,
    required_string,
    short,
    wrong_type,
)
from controlplane.kinds.generation.schema import schema_compile_problem

__all__ = [
    "NO_TOOL_CHOICE",
    "FunctionTool",
    "ToolCall",
    "ToolChoice",
    "call_id",
    "forced_call",
    "read_parallel_tool_calls",
    "read_tool_choice",
    "read_tools",
    "tool_call_schema",
]

MAX_TOOLS = 128  # OpenAI's limit on `tools`
FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
# A function declared without `parameters` takes none (OpenAI: "omitting parameters defines a function with an
# empty parameter list"): no free keys, or a small model fills the arguments with whatever it likes.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
_TOOL_KEYS = frozenset({"type", "function"})
_FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
ToolChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None = None
    # The JSON Schema of the arguments as JSON text (immutable, its keys in the author's order, which the grammar
    # generates them in); None when the function takes no parameters.
    parameters: str | None = None
    strict: bool = False

    def parameters_schema(self) -> dict[str, Any]:
        return json.loads(self.parameters) if self.parameters is not None else dict(NO_PARAMETERS)

    def for_template(self) -> dict[str, Any]:
        """The function as chat templates take it (transformers' ``apply_chat_template(tools=...)``: OpenAI's
        tool object), and as the prompt's tool list shows it."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters_schema()
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = "none"
    function: str | None = None  # the named function, when mode is "function"

    @property
    def forced(self) -> bool:
        """The line must answer with a call, decoded under the call's grammar."""
        return self.mode in ("required", "function")


NO_TOOL_CHOICE = ToolChoice()


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: the function's name and its arguments as compact JSON text (OpenAI's wire form)."""

    name: str
    arguments: str


def read_tools(body: Mapping[str, Any]) -> tuple[FunctionTool, ...]:
    """``tools``, every schema checked (valid Draft 2020-12, compiled by the engine's grammar library)."""
    value = body.get("tools")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise wrong_type("tools", "an array", value)
    check_array_length("tools", value, high=MAX_TOOLS)
    tools: list[FunctionTool] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(value):
        tool = _tool(item, f"tools[{i}]")
        if tool.name in seen:
            raise BodyError(
                f"tools[{i}].function.name",
                "invalid_value",
                f"Duplicate function name {short(tool.name)}: tools[{seen[tool.name]}] has the same name; "
                "function names must be unique.",
            )
        seen[tool.name] = i
        tools.append(tool)
    return tuple(tools)


def _tool(item: Any, param: str) -> FunctionTool:
    if not isinstance(item, dict):
        raise wrong_type(param, "an object", item)
    kind = item.get("type")
    if kind is None:
        raise missing(f"{param}.type")
    if kind == "custom":
        raise BodyError(f"{param}.type", "unsupported_value", "Custom tools are not supported; use function tools.")
    if kind != "function":
        raise BodyError(
            f"{param}.type", "invalid_value", f"Invalid value: {short(kind)}. Supported values are: 'function'."
        )
    refuse_unknown_keys(item, _TOOL_KEYS, param)
    function = item.get("function")
    where = f"{param}.function"
    if function is None:
        raise missing(where)
    if not isinstance(function, dict):
        raise wrong_type(where, "an object", function)
    refuse_unknown_keys(function, _FUNCTION_KEYS, where)
    name = required_string(function, "name", where)
    if not FUNCTION_NAME.fullmatch(name):
        raise BodyError(
            f"{where}.name",
            "invalid_value",
            f"Invalid '{where}.name': {short(name)} must match the pattern '^[a-zA-Z0-9_-]{{1,64}}$'.",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise wrong_type(f"{where}.description", "a string", description)
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise wrong_type(f"{where}.strict", "a boolean", strict)
    parameters = function.get("parameters")
    text = None if parameters is None else _parameters(parameters, f"{where}.parameters", name)
    return FunctionTool(name=name, description=description, parameters=text, strict=bool(strict))


def _parameters(schema: Any, param: str, name: str) -> str:
    if not isinstance(schema, dict):
        raise wrong_type(param, "an object (a JSON Schema)", schema)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise BodyError(
            param, "invalid_function_parameters", f"Invalid schema for function '{name}': at 'parameters{where}': "
            f"{exc.message[:200]}"
        ) from exc  # fmt: skip
    except RecursionError as exc:  # the line's JSON depth limit keeps this unreachable; no input may crash us
        raise BodyError(
            param,
            "invalid_function_parameters",
            f"Invalid schema for function '{name}': nested deeper than {MAX_JSON_DEPTH} levels.",
        ) from exc
    declared = schema.get("type", "object")
    if declared != "object" and not (isinstance(declared, list) and declared == ["object"]):
        raise BodyError(
            param,
            "invalid_function_parameters",
            f"Invalid schema for function '{name}': the arguments are a JSON object, so 'parameters' must describe "
            f"an object (type 'object'), got type {short(declared)}.",
        )
    text = json.dumps(schema)
    problem = schema_compile_problem(text)
    if problem:
        raise BodyError(param, "invalid_function_parameters", f"Invalid schema for function '{name}': {problem[:300]}")
    return text


def read_tool_choice(body: Mapping[str, Any], tools: tuple[FunctionTool, ...]) -> ToolChoice:
    value = body.get("tool_choice")
    if value is None:
        return ToolChoice("auto") if tools else NO_TOOL_CHOICE
    if value == "none":
        return NO_TOOL_CHOICE
    if isinstance(value, str):
        if value not in ("auto", "required"):
            raise BodyError(
                "tool_choice",
                "invalid_value",
                f"Invalid value: {short(value)}. Supported values are: 'none', 'auto' and 'required'.",
            )
        choice = ToolChoice(value)  # type: ignore[arg-type]  # one of the two, checked above
    elif isinstance(value, dict):
        choice = _named_choice(value)
    else:
        raise wrong_type("tool_choice", "a string or an object", value)
    if not tools:
        raise BodyError(
            "tool_choice",
            "invalid_value",
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
        )
    if choice.function is not None and all(tool.name != choice.function for tool in tools):
        raise BodyError(
            "tool_choice.function.name",
            "invalid_value",
            f"Invalid 'tool_choice': function {short(choice.function)} is not one of the functions in 'tools'.",
        )
    return choice


def _named_choice(value: dict[str, Any]) -> ToolChoice:
    kind = value.get("type")
    if kind is None:
        raise missing("tool_choice.type")
    if kind in ("allowed_tools", "custom"):
        raise BodyError("tool_choice.type", "unsupported_value", f"tool_choice of type {short(kind)} is not supported.")
    if kind != "function":
        raise BodyError(
            "tool_choice.type", "invalid_value", f"Invalid value: {short(kind)}. Supported values are: 'function'."
        )
    refuse_unknown_keys(value, _TOOL_KEYS, "tool_choice")
    function = value.get("function")
    if function is None:
        raise missing("tool_choice.function")
    if not isinstance(function, dict):
        raise wrong_type("tool_choice.function", "an object", function)
    refuse_unknown_keys(function, frozenset({"name"}), "tool_choice.function")
    return ToolChoice("function", required_string(function, "name", "tool_choice.function"))


def read_parallel_tool_calls(body: Mapping[str, Any]) -> bool:
    """OpenAI's default is true."""
    value = body.get("parallel_tool_calls")
    if value is None:
        return True
    if not isinstance(value, bool):
        raise wrong_type("parallel_tool_calls", "a boolean", value)
    return value


# --- the grammar of a forced call ---------------------------------------------------------------------------------


def tool_call_schema(tools: tuple[FunctionTool, ...], choice: ToolChoice) -> dict[str, Any] | None:
    """The JSON schema a forced call is decoded under, or None when the choice does not force one: the call object
    of each allowed function, ``anyOf`` over them when there are several."""
    if not choice.forced:
        return None
    allowed = [tool for tool in tools if choice.mode == "required" or tool.name == choice.function]
    options = [_call_object(tool, "" if len(allowed) == 1 else f"/anyOf/{i}") for i, tool in enumerate(allowed)]
    return options[0] if len(options) == 1 else {"anyOf": options}


def _call_object(tool: FunctionTool, at: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
            "arguments": _for_grammar(tool.parameters_schema(), f"{at}/properties/arguments"),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# Where a schema holds schemas (Draft 2020-12 and the older `definitions`/`additionalItems`); any other keyword's
# value is data (`const`, `enum`, `default`, ...), never walked.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMA_VALUES = frozenset(
    {"items", "additionalItems", "additionalProperties", "unevaluatedItems", "unevaluatedProperties", "not", "if",
     "then", "else", "contains", "propertyNames"}
)  # fmt: skip
_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def _for_grammar(schema: Any, prefix: str, *, close: bool = True) -> Any:
    """A parameters schema as the call's grammar takes it, under ``prefix`` of the call schema:

    - local references (``#/$defs/x``, ``#``) point into its new place (the decoding library resolves JSON pointers
      from the document's root);
    - an object that lists its properties and says nothing of others is closed (``additionalProperties: false``),
      as xgrammar's strict mode (vLLM's default guided-decoding backend) and OpenAI's strict function calling read
      it: a small model otherwise invents keys until max_tokens (tinylm, measured). Not inside ``allOf``, whose
      branches each list some of the properties. The arguments are still checked against the schema as written."""
    if not isinstance(schema, dict):
        return schema  # true / false
    converted: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            converted[key] = "#" + prefix + value[1:]
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            converted[key] = {name: _for_grammar(item, prefix) for name, item in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            converted[key] = [_for_grammar(item, prefix, close=key != "allOf") for item in value]
        elif key in _SCHEMA_VALUES:
            converted[key] = (
                [_for_grammar(item, prefix) for item in value]
                if isinstance(value, list)
                else _for_grammar(value, prefix)
            )
        else:
            converted[key] = value
    if close and "properties" in schema and not any(key in schema for key in _OPEN_KEYWORDS):
        converted["additionalProperties"] = False
    return converted


def forced_call(text: str, tools: tuple[FunctionTool, ...]) -> ToolCall | None:
    """The call a forced choice decoded (the grammar's JSON), or None where the text is not a whole call (cut at
    max_tokens)."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # the model's text: anything, nested past the parser's depth too
        return None
    return checked_call(value, tools)


def checked_call(value: Any, tools: tuple[FunctionTool, ...]) -> ToolCall | None:
    """``{"name": ..., "arguments": {...}}`` naming one of ``tools`` with arguments valid for its parameters, as
    a ToolCall; None for anything else."""
    if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
        return None
    name, arguments = value["name"], value["arguments"]
    tool = next((tool for tool in tools if tool.name == name), None)
    if tool is None or not isinstance(arguments, dict):
        return None
    try:
        if not Draft202012Validator(tool.parameters_schema()).is_valid(arguments):
            return None
    except (RecursionError, Unresolvable):  # a schema whose $ref loops, or arguments nested past the stack
        return None
    return ToolCall(name=tool.name, arguments=json.dumps(arguments, ensure_ascii=False, separators=(",", ":")))


def call_id(completion_id: str, choice: int, call: int) -> str:
    """``call_`` + 24 hex characters, the same for the same completion, choice and position."""
    digest = hashlib.sha256(f"{completion_id}/{choice}/{call}".encode()).hexdigest()
    return "call_" + digest[:24]
