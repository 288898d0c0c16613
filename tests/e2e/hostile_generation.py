"""The generation part of the end-to-end hostile corpus: tinylm chat-completions bodies the
chat kind refuses, each a valid body with one thing changed, with the field (`param`) and code its 400 line
must name. The parse-level corpus (tests/kinds/test_generation_hostile.py) has more cases against a test
tokenizer; these run against the served model's own tokenizer and context (256), through a worker.

All go in one batch (one model per batch, and the endpoint is chat completions, so not the embeddings
corpus's batches), between valid lines that must complete."""

from __future__ import annotations

from typing import Any

CHAT = "/v1/chat/completions"
MODEL = "tinylm"
CONTEXT = 256  # tinylm's context_length in the catalogue (controlplane/fleet/catalogue/seed.py)
DROP = object()  # a field removed from the valid body
IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
BAD_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}


def _user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


# name -> (changes to the valid body, param within the body, code)
GENERATION_CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "empty-messages": ({"messages": []}, "messages", "empty_array"),
    "no-messages": ({"messages": DROP}, "messages", "missing_required_parameter"),
    "wrong-role": ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "invalid_value"),
    "non-string-content": ({"messages": [_user(5)]}, "messages[0].content", "invalid_type"),
    "content-an-object": ({"messages": [_user({"text": "x"})]}, "messages[0].content", "invalid_type"),
    "n-above-8": ({"n": 9}, "n", "integer_above_max_value"),
    "max-tokens-zero": ({"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    "max-tokens-negative": ({"max_tokens": -1}, "max_tokens", "integer_below_min_value"),
    "max-tokens-over-context": ({"max_tokens": CONTEXT}, "max_tokens", "context_length_exceeded"),
    "max-completion-tokens-huge": (
        {"max_tokens": DROP, "max_completion_tokens": 10**12},
        "max_completion_tokens",
        "context_length_exceeded",
    ),
    "temperature-above-2": ({"temperature": 2.5}, "temperature", "decimal_above_max_value"),
    "temperature-below-0": ({"temperature": -0.5}, "temperature", "decimal_below_min_value"),
    "unknown-response-format": ({"response_format": {"type": "xml"}}, "response_format.type", "invalid_value"),
    "invalid-json-schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": {"type": "objekt"}}}},
        "response_format.json_schema.schema",
        "invalid_json_schema",
    ),
    "stream-true": ({"stream": True}, "stream", "unsupported_value"),
    "tool-bad-schema": ({"tools": [BAD_TOOL]}, "tools[0].function.parameters", "invalid_function_parameters"),
    "image": (
        {"messages": [_user([{"type": "text", "text": "see"}, IMAGE])]},
        "messages[0].content[1].type",
        "unsupported_value",
    ),
    "prompt-over-context": ({"messages": [_user("count " * (2 * CONTEXT))]}, "messages", "context_length_exceeded"),
}


def valid_body(custom_id_number: int = 1) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [_user(f"count from {custom_id_number} to {custom_id_number + 3}")],
        "max_tokens": 12,
        "temperature": 0,
    }


def case_body(changes: dict[str, Any]) -> dict[str, Any]:
    body = valid_body()
    for key, value in changes.items():
        if value is DROP:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def generation_lines() -> list[dict[str, Any]]:
    """Valid lines first, between and last; each case under its name as custom_id."""

    def line(custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}

    cases = [line(name, case_body(changes)) for name, (changes, _param, _code) in GENERATION_CASES.items()]
    middle = len(cases) // 2
    return [
        line("ok-1", valid_body(1)),
        *cases[:middle],
        line("ok-2", valid_body(2)),
        *cases[middle:],
        line("ok-3", valid_body(3)),
    ]
