"""The schema helper reads OpenAI's spec exactly: null only where the spec allows it, `nullable: true`
honoured, `null_for_unset` widening optional fields only."""

from __future__ import annotations

import json
import re

import pytest

from scripts.vendor_openai_schemas import DEFAULT_ROOTS, schema_closure
from tests.contracts.openai_schema import VENDORED, schema_errors, schema_names, validate, vendored_source


def _chat(**extra):
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [], **extra}


def test_the_source_is_recorded_and_matches_the_readme():
    source = vendored_source()
    assert re.fullmatch(r"[0-9a-f]{40}", source["commit"])
    readme = (VENDORED.parent / "README.md").read_text()
    assert source["commit"] in readme
    assert source["repository"] == "https://github.com/openai/openai-openapi"
    assert set(source["roots"]) == set(DEFAULT_ROOTS)


def test_the_subset_is_closed_under_refs():
    schemas = json.loads(VENDORED.read_text())["components"]["schemas"]
    # Re-extracting from the subset itself finds nothing missing and nothing extra.
    assert schema_closure(schemas, DEFAULT_ROOTS) == schemas
    assert set(DEFAULT_ROOTS) <= set(schema_names())


def test_a_field_typed_string_is_not_nullable():
    validate(_chat(system_fingerprint="fp_1"), "CreateChatCompletionResponse")
    with pytest.raises(Exception, match="None is not of type 'string'"):
        validate(_chat(system_fingerprint=None), "CreateChatCompletionResponse")


def test_a_field_the_spec_makes_nullable_with_anyof_accepts_null():
    validate(_chat(service_tier=None), "CreateChatCompletionResponse")
    assert schema_errors(_chat(service_tier="bogus"), "CreateChatCompletionResponse")


def test_openapi_nullable_true_is_honoured():
    # CreateCompletionRequest.suffix is {"type": "string", "nullable": true}: a plain 2020-12 validator
    # would refuse the null.
    validate({"model": "m", "prompt": "p", "suffix": None}, "CreateCompletionRequest")
    assert schema_errors({"model": "m", "prompt": "p", "suffix": 3}, "CreateCompletionRequest")


def test_null_for_unset_widens_optional_fields_only():
    validate(_chat(system_fingerprint=None), "CreateChatCompletionResponse", null_for_unset=True)
    # `model` is required: null stays invalid even in the lenient reading.
    assert schema_errors(_chat(model=None), "CreateChatCompletionResponse", null_for_unset=True)


def test_required_fields_are_enforced():
    body = _chat()
    del body["created"]
    assert any(
        "'created' is a required property" in e.message for e in schema_errors(body, "CreateChatCompletionResponse")
    )


def test_an_unknown_schema_name_is_an_error():
    with pytest.raises(KeyError):
        validate({}, "NoSuchSchema")
