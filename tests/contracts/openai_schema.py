"""Validate an object against one of OpenAI's published schemas (the subset vendored in
``tests/contracts/openai/schemas.json``, see the README there), with JSON Schema Draft 2020-12.

How null is treated, exactly:
- OpenAI's document is OpenAPI 3.1, whose schemas are JSON Schema 2020-12: null is allowed where a
  schema says so (``anyOf: [..., {"type": "null"}]``, ``type: [..., "null"]``).
- Some schemas still carry OpenAPI 3.0's ``nullable: true`` (30 times in the vendored subset, mostly in
  request bodies). A 2020-12 validator ignores that keyword, which would refuse a null the spec allows; so
  each ``nullable: true`` schema is read as ``anyOf: [schema, {"type": "null"}]`` here. Nothing else allows
  null: e.g. ``system_fingerprint`` (``type: string``) must be a string or absent.
- OpenAI's live API also answers null for optional fields it has no value for (a Batch's ``output_file_id``
  before it exists) though the spec does not say nullable. ``null_for_unset=True`` accepts exactly that: null
  for a property that is not in its object's ``required`` list. A required property never becomes nullable.
  The default is the strict reading; objects rendered by this service are held to it.
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

VENDORED = Path(__file__).resolve().parent / "openai" / "schemas.json"
_BASE_URI = "urn:openai-openapi"

__all__ = ["ValidationError", "schema_errors", "schema_names", "validate", "vendored_source"]


def _nullable_as_2020_12(node: Any) -> Any:
    if isinstance(node, list):
        return [_nullable_as_2020_12(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _nullable_as_2020_12(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


def _optional_as_nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_optional_as_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _optional_as_nullable(value) for key, value in node.items()}
    properties = node.get("properties")
    if isinstance(properties, dict):
        required = set(node.get("required", ()))
        converted["properties"] = {
            name: schema if name in required else {"anyOf": [schema, {"type": "null"}]}
            for name, schema in converted["properties"].items()
        }
    return converted


@functools.cache
def _document() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(VENDORED.read_text(encoding="utf-8"))
    return document


@functools.cache
def _validator(name: str, null_for_unset: bool) -> Draft202012Validator:
    document = copy.deepcopy(_document())
    schemas = _nullable_as_2020_12(document["components"]["schemas"])
    if null_for_unset:
        schemas = _optional_as_nullable(schemas)
    if name not in schemas:
        raise KeyError(f"{name!r} is not vendored; add it to scripts/vendor_openai_schemas.py's roots")
    resource = Resource.from_contents({"components": {"schemas": schemas}}, default_specification=DRAFT202012)
    registry: Registry[Any] = Registry().with_resource(_BASE_URI, resource)
    return Draft202012Validator({"$ref": f"{_BASE_URI}#/components/schemas/{name}"}, registry=registry)


def validate(instance: Any, name: str, *, null_for_unset: bool = False) -> None:
    """Raise ``ValidationError`` (the most relevant one) if ``instance`` is not a valid ``name``."""
    errors = schema_errors(instance, name, null_for_unset=null_for_unset)
    if errors:
        raise errors[0]


def schema_errors(instance: Any, name: str, *, null_for_unset: bool = False) -> list[ValidationError]:
    validator = _validator(name, null_for_unset)
    return sorted(validator.iter_errors(instance), key=lambda e: (len(e.path), list(map(str, e.path))))


def schema_names() -> list[str]:
    return sorted(_document()["components"]["schemas"])


def raw_schema(name: str) -> dict[str, Any]:
    """The vendored schema as OpenAI wrote it (for tests that read its structure, e.g. property names)."""
    schema: dict[str, Any] = _document()["components"]["schemas"][name]
    return schema


def vendored_source() -> dict[str, Any]:
    source: dict[str, Any] = _document()["x-vendored"]
    return source
