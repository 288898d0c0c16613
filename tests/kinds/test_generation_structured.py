"""response_format json_object / json_schema at validation and on the engine's wire (kinds/generation/schema.py):
accepted for a model whose catalogue entry says its engine constrains decoding, a 400 line otherwise; a schema
the decoding library cannot compile is a 400 naming it; json_object needs the word JSON (OpenAI's rule)."""

from __future__ import annotations

import json

import pytest

from controlplane.kinds.base import BodyIssue
from controlplane.kinds.registry import kind_for
from tests.kinds.test_generation_kind import CHAT, chat, run, tinylm

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "numbers": {"type": "array", "items": {"type": "integer"}}},
    "required": ["name", "numbers"],
}


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "count", "schema": schema, "strict": True}}


def refusal(body, **model_changes) -> BodyIssue:
    with pytest.raises(BodyIssue) as refused:
        kind_for(CHAT).parse_body(body, model=tinylm(**model_changes))
    return refused.value


def test_structured_formats_reach_the_engine_as_vllms_guided_decoding():
    bodies = [
        chat("count from 1 to 3 as JSON", response_format={"type": "json_object"}),
        chat("count from 1 to 3", response_format=schema_format(SCHEMA)),
        chat("count from 1 to 3", response_format={"type": "text"}),
    ]
    _, control, engine = run(CHAT, bodies)
    sent = [request.sampling_parameters.get("guided_decoding") for request in engine.submitted]
    assert json.loads(sent[0]) == {"json_object": True}
    assert json.loads(sent[1]) == {"json": SCHEMA}
    assert list(json.loads(sent[1])["json"]["properties"]) == ["name", "numbers"]  # the author's order
    assert sent[2] is None
    assert sorted(control.finished) == [1, 2, 3]


def test_a_model_whose_engine_does_not_constrain_is_a_400_line():
    issue = refusal(chat("as json", response_format={"type": "json_object"}), structured_outputs=False)
    assert (issue.param, issue.code) == ("body.response_format", "unsupported_value")
    assert "no constrained decoding" in issue.message
    issue = refusal(chat("x", response_format=schema_format(SCHEMA)), structured_outputs=False)
    assert issue.param == "body.response_format"


@pytest.mark.parametrize(
    "schema, says",
    [
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}, "does not exist"),
        ({"type": "string", "pattern": "(?<=a)b"}, "look-around"),
        ({"not": {"type": "string"}}, "not"),
        ({"type": "objekt"}, "objekt"),  # not Draft 2020-12 at all: the metaschema check says so first
    ],
)
def test_a_schema_that_cannot_be_compiled_is_a_400_naming_it(schema, says):
    issue = refusal(chat("x", response_format=schema_format(schema)))
    assert (issue.param, issue.code) == ("body.response_format.json_schema.schema", "invalid_json_schema")
    assert says in issue.message


def test_json_object_needs_the_word_json_in_the_messages():
    issue = refusal(chat("count from 1 to 3", response_format={"type": "json_object"}))
    assert (issue.param, issue.code) == ("body.messages", "invalid_value")
    assert "must contain the word 'json'" in issue.message
    system = {"role": "system", "content": "Answer in Json."}
    body = {"model": "tinylm", "messages": [system, {"role": "user", "content": "count from 1 to 3"}]}
    line = kind_for(CHAT).parse_body({**body, "response_format": {"type": "json_object"}}, model=tinylm())
    assert line.request.response_format.type == "json_object"  # any case, any message
    # json_schema has no such rule.
    assert kind_for(CHAT).parse_body(chat("count", response_format=schema_format(SCHEMA)), model=tinylm())


def test_compiled_schemas_are_remembered_by_digest_and_bounded():
    """Each distinct schema is compiled once per process; what is kept is its digest and verdict, not its text
    (a line may carry a schema of up to a line's size), and at most a bounded number of them."""
    from controlplane.kinds.generation import schema
    from controlplane.kinds.generation.fields import ResponseFormat

    def format_of(text: str) -> ResponseFormat:
        return ResponseFormat(type="json_schema", name="s", schema=text)

    huge = json.dumps({"type": "object", "description": "x" * 500_000, "properties": {"a": {"type": "string"}}})
    schema.check_schema_compiles(format_of(huge))
    for number in range(schema._VERDICTS_MAX + 20):
        schema.check_schema_compiles(format_of(json.dumps({"type": "object", "title": f"t{number}"})))
    assert len(schema._VERDICTS) == schema._VERDICTS_MAX
    assert all(len(key) == 32 and len(verdict) <= 300 for key, verdict in schema._VERDICTS.items())
