"""response_format → the engine's constrained decoding: checked at validation, sent as the ``guided_decoding``
sampling parameter, JSON text: every release of Triton's vLLM backend parses that key (the newer ones map it
to vLLM's ``structured_outputs``, which older ones do not know), and so does tinylm's cb_grammar.py.

A schema that is valid Draft 2020-12 (fields.py checks that) may still use a construct the decoding
library cannot compile (``not``, look-around in a ``pattern``, an unsatisfiable ``required``): that is a 400 line
naming the schema at validation, never a failure at run time. The check compiles the schema with llguidance,
tinylm's library (docs/architecture/generation.md, "Constrained decoding"), with the engine's options, tokenizer aside.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

from controlplane.kinds.generation.fields import BodyError, ResponseFormat

__all__ = ["check_json_object_prompt", "check_schema_compiles", "schema_compile_problem", "structured_outputs"]

# The engine's JSON options (triton_models/tinylm/1/cb_grammar.py JSON_OPTIONS): compact, no free whitespace.
_JSON_OPTIONS = {"whitespace_flexible": False}
SCHEMA_PARAM = "response_format.json_schema.schema"


def structured_outputs(response_format: ResponseFormat) -> str | None:
    """The ``guided_decoding`` value for the engine (JSON text, as the vLLM backend expects), or None."""
    if response_format.type == "json_object":
        return json.dumps({"json_object": True})
    if response_format.type == "json_schema":
        return json.dumps({"json": json.loads(response_format.schema or "{}")})
    return None


def check_schema_compiles(response_format: ResponseFormat) -> None:
    """Raises BodyError naming the schema when the decoding library cannot compile it."""
    if response_format.type != "json_schema" or response_format.schema is None:
        return
    problem = schema_compile_problem(response_format.schema)
    if problem:
        raise BodyError(
            SCHEMA_PARAM,
            "invalid_json_schema",
            f"Invalid schema for response_format '{response_format.name}': {problem[:300]}",
        )


# A batch repeats its schema on every line: each distinct one is compiled once per process. Remembered by its
# digest with the (cut) verdict only: keyed by the text, 256 schemas of up to a line's size (1 MiB) held 256 MB.
_VERDICTS: OrderedDict[bytes, str] = OrderedDict()
_VERDICTS_MAX = 256
_VERDICTS_LOCK = threading.Lock()


def schema_compile_problem(schema_text: str) -> str:
    """What the decoding library says is wrong with the schema (JSON text), "" when it compiles; also used for the
    schemas of tool parameters (tools.py)."""
    digest = hashlib.sha256(schema_text.encode()).digest()
    with _VERDICTS_LOCK:
        if digest in _VERDICTS:
            _VERDICTS.move_to_end(digest)
            return _VERDICTS[digest]
    import llguidance  # only processes that see a structured line load it

    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_text, overrides=_JSON_OPTIONS)  # type: ignore[arg-type]
    problem = str(llguidance.LLMatcher.validate_grammar(grammar))[:300]
    with _VERDICTS_LOCK:
        _VERDICTS[digest] = problem
        while len(_VERDICTS) > _VERDICTS_MAX:
            _VERDICTS.popitem(last=False)
    return problem


def check_json_object_prompt(response_format: ResponseFormat, contents: list[str]) -> None:
    """OpenAI's rule for json_object: the word JSON, in any case, must appear in the messages (else a model asked
    for JSON without being told may emit whitespace until max_tokens)."""
    if response_format.type == "json_object" and not any("json" in text.lower() for text in contents):
        raise BodyError(
            "messages",
            "invalid_value",
            "'messages' must contain the word 'json' in some form, to use 'response_format' of type 'json_object'.",
        )
