"""Constrained decoding in the engine (cb_grammar.py): what comes out under a JSON grammar parses, follows the
schema, and ends the way OpenAI's structured outputs end. The prompts are the plain counting task, whose
unconstrained answer ("3 4 5 …") is not JSON: every test here fails with the mask switched off."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.support.structured_schema import SCHEMA

PROMPTS = ["count from 3 to 9 :", "count from 12 to 20 :", "count from 0 to 5 as json :"]


def params(**fields):
    from cb_sampling import SamplingParams

    return SamplingParams.from_dict({"temperature": 0.0, "max_tokens": 120, **fields})


def outputs(engine, structured, **fields):
    """(text, finish_reason) of every choice, over seeds and temperatures (greedy, warm, hot with top_p)."""
    settings = [{"temperature": 0.0}, {"temperature": 0.8, "top_p": 0.9}, {"temperature": 1.5}]
    requests = []
    for seed in range(3):
        for setting in settings:
            sampling = params(seed=seed, structured_outputs=structured, **setting, **fields)
            requests += engine.generate(PROMPTS, sampling)
    return [(c.text, c.finish_reason) for r in requests for c in r.choices]


def test_json_object_outputs_are_objects(engine):
    results = outputs(engine, {"json_object": True})
    finished = [text for text, reason in results if reason == "stop"]
    assert len(finished) >= len(results) // 2  # the model closes its objects (else this would test nothing)
    for text in finished:
        assert isinstance(json.loads(text), dict), text


def test_json_schema_outputs_validate(engine):
    results = outputs(engine, {"json": SCHEMA}, n=2)
    finished = [text for text, reason in results if reason == "stop"]
    assert len(finished) >= len(results) // 2
    for text in finished:
        jsonschema.validate(json.loads(text), SCHEMA)


def test_greedy_under_a_schema_follows_the_models_own_preference(engine):
    # tinylm learned '{"numbers":[…]}' for "as json": the grammar allows it, so greedy decoding produces it.
    schema = {"type": "object", "properties": {"numbers": {"type": "array", "items": {"type": "integer"}}}}
    (request,) = engine.generate(["count from 4 to 9 as json :"], params(structured_outputs={"json": schema}))
    (choice,) = request.choices
    assert json.loads(choice.text) == {"numbers": [4, 5, 6, 7, 8, 9]}
    assert choice.finish_reason == "stop"


def test_max_tokens_cuts_with_length(engine):
    (request,) = engine.generate(PROMPTS[:1], params(max_tokens=4, structured_outputs={"json": SCHEMA}))
    (choice,) = request.choices
    assert choice.finish_reason == "length" and len(choice.token_ids) == 4
    assert choice.text.startswith('{"n')  # the start of a document of the schema, incomplete as OpenAI's
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice.text)


def test_stop_at_the_closing_brace_without_eos(engine):
    (request,) = engine.generate(PROMPTS[:1], params(structured_outputs={"json_object": True}))
    (choice,) = request.choices
    assert choice.finish_reason == "stop" and choice.text.endswith("}")
    assert choice.token_ids[-1] not in engine.eos_token_ids  # ended by the grammar, not by a sampled EOS


def test_logprobs_penalties_and_seeds_under_the_mask(engine):
    structured = {"json": SCHEMA}
    sampled = params(n=3, temperature=1.0, seed=7, logprobs=2, frequency_penalty=0.5, structured_outputs=structured)
    (alone,) = engine.generate(PROMPTS[:1], sampled)
    crowd = engine.generate([PROMPTS[1], PROMPTS[0]], [params(), sampled])
    assert [c.token_ids for c in crowd[1].choices] == [c.token_ids for c in alone.choices]
    for choice in alone.choices:
        assert len(choice.picks) == len(choice.token_ids)
        for token_id, pick in zip(choice.token_ids, choice.picks, strict=True):
            assert pick.token_id == token_id and pick.logprob > float("-inf") and token_id in pick.top
        assert choice.cumulative_logprob == pytest.approx(sum(p.logprob for p in choice.picks))


def test_each_schema_is_compiled_once(engine):
    other = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    engine.generate(PROMPTS, params(structured_outputs={"json": other}))
    engine.generate(PROMPTS, params(n=2, structured_outputs={"json": other}))
    compiled = engine._grammars._compiled
    assert sum(1 for text in compiled if json.loads(text) == other) == 1


def test_a_schema_the_library_cannot_compile_is_refused_at_submit(engine):
    bad = {"type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}, "required": ["a"]}
    with pytest.raises(ValueError, match="cannot be compiled"):
        engine.submit(PROMPTS[0], params(structured_outputs={"json": bad}), request_id="bad", on_update=print)


def test_structured_outputs_field_is_checked():
    from cb_sampling import SamplingParams

    for wrong in ({"regex": "a+"}, {"json": 3}, "not json", {"json_object": False}):
        with pytest.raises(ValueError, match="structured_outputs"):
            SamplingParams.from_dict({"structured_outputs": wrong})
    for key in ("guided_decoding", "structured_outputs"):  # vLLM's older and newer names
        parsed = SamplingParams.from_json(json.dumps({key: json.dumps({"json": SCHEMA, "backend": "auto"})}))
        assert parsed.structured_outputs is not None and json.loads(parsed.structured_outputs.schema_text) == SCHEMA
    with pytest.raises(ValueError, match=r"sampling_parameters\.guided_decoding"):
        SamplingParams.from_dict({"guided_decoding": {"grammar": "root ::= x"}})
