"""The JSON schema the structured-output tests decode against (the engine's tests and the end-to-end batch): a
string, an integer array and an enum, each bounded so a tiny model's answer ends inside max_tokens."""

from __future__ import annotations

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "numbers": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 12},
        "kind": {"enum": ["even", "odd", "mixed"]},
    },
    "required": ["name", "numbers", "kind"],
    "additionalProperties": False,
}
