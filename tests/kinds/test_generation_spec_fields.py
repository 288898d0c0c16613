"""Every field of OpenAI's request bodies is classified: honoured, or refused with a 400 naming it when set to
anything but a value that means "not used". A field OpenAI adds to its spec fails here until it is classified."""

from __future__ import annotations

import pytest

from controlplane.kinds.generation.bodies import (
    CHAT_HONOURED,
    CHAT_NOT_HONOURED,
    COMPLETION_HONOURED,
    COMPLETION_NOT_HONOURED,
    BodyError,
    parse_chat_body,
    parse_completion_body,
)
from tests.contracts.openai_schema import raw_schema
from tests.kinds.conftest import CONTEXT
from tests.kinds.test_generation_hostile import VALID_CHAT, VALID_COMPLETION


def spec_properties(name: str) -> set[str]:
    """Top-level property names of a request schema, following allOf and $ref as OpenAI composes them."""
    schema = raw_schema(name)
    found = set(schema.get("properties", {}))
    for part in schema.get("allOf", []):
        found |= spec_properties(part["$ref"].rsplit("/", 1)[1]) if "$ref" in part else set(part.get("properties", {}))
    return found


@pytest.mark.parametrize(
    ("schema", "honoured", "not_honoured"),
    [
        ("CreateChatCompletionRequest", CHAT_HONOURED, CHAT_NOT_HONOURED),
        ("CreateCompletionRequest", COMPLETION_HONOURED, COMPLETION_NOT_HONOURED),
    ],
)
def test_every_spec_field_is_classified_and_nothing_else(schema, honoured, not_honoured):
    assert not honoured & set(not_honoured)
    assert spec_properties(schema) == honoured | set(not_honoured)


CASES = [
    *((parse_chat_body, VALID_CHAT, name, neutral) for name, neutral in CHAT_NOT_HONOURED.items()),
    *((parse_completion_body, VALID_COMPLETION, name, neutral) for name, neutral in COMPLETION_NOT_HONOURED.items()),
]


@pytest.mark.parametrize(("parse", "valid", "name", "neutral"), CASES, ids=[f"{c[0].__name__}:{c[2]}" for c in CASES])
def test_a_field_not_honoured_is_refused_unless_unused(tokenizer, parse, valid, name, neutral):
    for value in (None, *neutral):
        parse({**valid, name: value}, tokenizer=tokenizer, context_length=CONTEXT)
    with pytest.raises(BodyError) as caught:
        parse({**valid, name: {"some": "setting"}}, tokenizer=tokenizer, context_length=CONTEXT)
    assert caught.value.param == name
    assert caught.value.code == ("unsupported_value" if neutral else "unsupported_parameter")
