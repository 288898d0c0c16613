"""The field-level rules of a generation line's body, shared by chat and completions: the line error,
typed readers for OpenAI's scalar fields, ``stop``, ``response_format``, ``metadata`` and the table of
fields the service knows but does not honour.

Error codes are OpenAI's own (``missing_required_parameter``, ``invalid_type``, ``integer_above_max_value``,
``unsupported_parameter``, ...), so a tenant's handling of OpenAI's 400s works unchanged; ``param`` is the
field's path in the body as OpenAI writes it (``messages[2].role``, ``stop[0]``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError

from controlplane.core.jsontext import MAX_JSON_DEPTH

MAX_STOP_SEQUENCES = 4  # OpenAI's limit
# Metadata limits as OpenAI documents them for every `metadata` map.
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
# OpenAI's rule for response_format.json_schema.name.
_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class BodyError(Exception):
    """A line whose body cannot be run: written to the error file as a 400 with OpenAI's error body, while
    the rest of the batch runs. Carries the same ``code``/``message``/``param`` as batches.lines.LineIssue."""

    status_code = 400
    error_type = "invalid_request_error"

    def __init__(self, param: str | None, code: str, message: str):
        # All three in args, so the error pickles (Celery results, process pools) and comes back whole.
        super().__init__(param, code, message)
        self.param = param
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def error_body(self) -> dict[str, Any]:
        """OpenAI's error response body (ErrorResponse in its spec)."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    def __repr__(self) -> str:
        return f"BodyError(param={self.param!r}, code={self.code!r}, message={self.message!r})"


def short(value: Any) -> str:
    """A user value for a message: JSON as the tenant wrote it, cut to 100 characters."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= 100 else text[:99] + "…"


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def wrong_type(param: str, expected: str, value: Any) -> BodyError:
    return BodyError(
        param, "invalid_type", f"Invalid type for '{param}': expected {expected}, but got {json_type(value)}."
    )


def require(body: Mapping[str, Any], name: str) -> Any:
    """A required field; null counts as missing, as in OpenAI's answers."""
    if body.get(name) is None:
        raise missing(name)
    return body[name]


def missing(param: str) -> BodyError:
    return BodyError(param, "missing_required_parameter", f"Missing required parameter: '{param}'.")


def refuse_unknown_keys(value: Mapping[str, Any], known: frozenset[str], param: str) -> None:
    """A 400 naming the first (sorted) key of ``value`` that is not in ``known``, as ``{param}.{key}``."""
    unknown = sorted(set(value) - known)
    if unknown:
        raise BodyError(f"{param}.{unknown[0]}", "unknown_parameter", f"Unrecognized argument: {short(unknown[0])}.")


def required_string(container: Mapping[str, Any], key: str, param: str) -> str:
    """``container[key]``, a string; ``param`` is the container's path (the error names ``param.key``)."""
    value = container.get(key)
    if value is None:
        raise missing(f"{param}.{key}")
    if not isinstance(value, str):
        raise wrong_type(f"{param}.{key}", "a string", value)
    return value


def check_array_length(param: str, items: list[Any], *, high: int | None = None) -> None:
    """At least one item, and at most ``high``: OpenAI's errors for an array out of its bounds."""
    if not items:
        raise BodyError(
            param,
            "empty_array",
            f"Invalid '{param}': empty array. Expected an array with minimum length 1, but got an empty array instead.",
        )
    if high is not None and len(items) > high:
        raise BodyError(
            param,
            "array_above_max_length",
            f"Invalid '{param}': array too long. Expected an array with maximum length {high}, "
            f"but got an array with length {len(items)} instead.",
        )


def read_integer(body: Mapping[str, Any], name: str, *, low: int, high: int | None = None) -> int | None:
    """An optional integer (null = absent) in [low, high]. JSON numbers like 2.0 are refused as OpenAI does;
    bools are refused too (Python's True is an int)."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(name, "an integer", value)
    if value < low:
        raise BodyError(
            name,
            "integer_below_min_value",
            f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but got {value} instead.",
        )
    if high is not None and value > high:
        raise BodyError(
            name,
            "integer_above_max_value",
            f"Invalid '{name}': integer above maximum value. Expected a value <= {high}, but got {value} instead.",
        )
    return value


def read_number(
    body: Mapping[str, Any], name: str, *, default: float, low: float, high: float, low_open: bool = False
) -> float:
    """An optional number (null = absent = ``default``) in [low, high], or (low, high] with ``low_open``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise wrong_type(name, "a number", value)
    if value < low or (low_open and value == low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise BodyError(
            name,
            "decimal_below_min_value",
            f"Invalid '{name}': decimal below minimum value. Expected a value {bound}, but got {value} instead.",
        )
    if value > high:
        raise BodyError(
            name,
            "decimal_above_max_value",
            f"Invalid '{name}': decimal above maximum value. Expected a value <= {high}, but got {value} instead.",
        )
    return float(value)


def read_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise wrong_type(name, "a boolean", value)
    return value


def read_string(body: Mapping[str, Any], name: str, *, max_chars: int | None = None) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise wrong_type(name, "a string", value)
    if max_chars is not None and len(value) > max_chars:
        raise BodyError(
            name,
            "string_above_max_length",
            f"Invalid '{name}': string too long. Expected a string with maximum length {max_chars}, "
            f"but got a string with length {len(value)} instead.",
        )
    return value


def read_stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    """``stop``: a string or 1..4 strings. An empty string would end every completion before its first
    token, so it is refused (stricter than the spec, which allows it)."""
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise wrong_type("stop", "a string or an array of strings", value)
    check_array_length("stop", items, high=MAX_STOP_SEQUENCES)
    for i, item in enumerate(items):
        param = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(item, str):
            raise wrong_type(param, "a string", item)
        if not item:
            raise BodyError(param, "invalid_value", f"Invalid '{param}': a stop sequence must not be empty.")
    return tuple(items)


def read_metadata(body: Mapping[str, Any]) -> tuple[tuple[str, str], ...] | None:
    """``metadata`` as sorted pairs (hashable, so the request stays a value)."""
    value = body.get("metadata")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise wrong_type("metadata", "an object", value)
    if len(value) > MAX_METADATA_KEYS:
        raise BodyError(
            "metadata", "object_above_max_properties", f"Invalid 'metadata': at most {MAX_METADATA_KEYS} keys."
        )
    for key, item in value.items():
        param = f"metadata.{key}"
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise BodyError(
                param, "invalid_value", f"Invalid 'metadata': keys are at most {MAX_METADATA_KEY_CHARS} characters."
            )
        if not isinstance(item, str):
            raise wrong_type(param, "a string", item)
        if len(item) > MAX_METADATA_VALUE_CHARS:
            raise BodyError(
                param, "string_above_max_length", f"Invalid '{param}': at most {MAX_METADATA_VALUE_CHARS} characters."
            )
    return tuple(sorted(value.items()))


@dataclass(frozen=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    # The JSON Schema as JSON text (immutable, and the form the engines' guided-decoding parameters take), its
    # keys in the author's order: the engine generates properties in that order, as OpenAI does.
    schema: str | None = None
    strict: bool = False


PLAIN_TEXT = ResponseFormat()


def read_response_format(body: Mapping[str, Any]) -> ResponseFormat:
    value = body.get("response_format")
    if value is None:
        return ResponseFormat()
    if not isinstance(value, dict):
        raise wrong_type("response_format", "an object", value)
    kind = value.get("type")
    if kind is None:
        raise missing("response_format.type")
    if kind in ("text", "json_object"):
        return ResponseFormat(type=kind)
    if kind != "json_schema":
        raise BodyError(
            "response_format.type",
            "invalid_value",
            f"Invalid value: {short(kind)}. Supported values are: 'text', 'json_object' and 'json_schema'.",
        )
    spec = _required_object(value, "json_schema", "response_format.json_schema")
    name = spec.get("name")
    if name is None:
        raise missing("response_format.json_schema.name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise BodyError(
            "response_format.json_schema.name",
            "invalid_value",
            f"Invalid 'response_format.json_schema.name': {short(name)} must match ^[a-zA-Z0-9_-]{{1,64}}$.",
        )
    # The spec leaves `schema` optional, but constrained decoding needs one: refused rather than ignored.
    schema = _required_object(spec, "schema", "response_format.json_schema.schema")
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise BodyError(
            "response_format.json_schema.schema",
            "invalid_json_schema",
            f"Invalid schema for response_format '{name}': at 'schema{where}': {exc.message[:200]}",
        ) from exc
    except RecursionError as exc:  # the line's JSON depth limit keeps this unreachable; no input may crash us
        raise BodyError(
            "response_format.json_schema.schema",
            "invalid_json_schema",
            f"Invalid schema for response_format '{name}': nested deeper than {MAX_JSON_DEPTH} levels.",
        ) from exc
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise wrong_type("response_format.json_schema.strict", "a boolean", strict)
    return ResponseFormat(type="json_schema", name=name, schema=json.dumps(schema), strict=bool(strict))


def _required_object(container: Mapping[str, Any], key: str, param: str) -> dict[str, Any]:
    value = container.get(key)
    if value is None:
        raise missing(param)
    if not isinstance(value, dict):
        raise wrong_type(param, "an object", value)
    return value


def check_unsupported(body: Mapping[str, Any], known: Mapping[str, tuple[Any, ...]], honoured: frozenset[str]) -> None:
    """Refuse what the service would otherwise silently get wrong. ``known`` maps each field of OpenAI's request
    that is not honoured to the values that mean "not used" (null always does); any other value is a 400 naming
    the field. A field in neither table is not OpenAI's: refused as OpenAI refuses it."""
    for name, value in body.items():
        if name in honoured:
            continue
        if name not in known:
            raise BodyError(name, "unknown_parameter", f"Unrecognized request argument supplied: {short(name)}.")
        if value is None or any(value == ok and type(value) is type(ok) for ok in known[name]):
            continue
        if name == "stream":
            message = "stream: true is not supported in a batch; the whole completion is written to the output file."
        else:
            message = f"'{name}' is not supported by this service (got {short(value)})."
        # OpenAI's distinction: a field refused whatever its value, or only some of its values.
        raise BodyError(name, "unsupported_value" if known[name] else "unsupported_parameter", message)
