"""Constrained decoding for the continuous-batching engine: JSON (any object) or a JSON schema, with llguidance.

Why llguidance (bench/constrained.py, figures in docs/performance.md): a 8 MB wheel with no dependency beyond what
the project has, a schema compiled in milliseconds and a mask in ~15 us a token, full JSON-schema coverage with
clear errors for what it cannot compile; xgrammar was as fast but pulls ~1 GB (triton) into the CPU image,
outlines-core took seconds to compile "any JSON object", lm-format-enforcer does not import under transformers 5.

The request says what to follow in `sampling_parameters.guided_decoding` (or `structured_outputs`, its newer
name), as Triton's vLLM backend parses them: `{"json": <schema>}` or `{"json_object": true}`, the dict or its
JSON text; `backend` is the engine's choice and ignored. One matcher per choice: `mask` removes
every token the grammar forbids (EOS only once the document is complete), `advance` moves past the token taken;
`complete` says the document is closed and nothing may follow, when the engine ends the choice with "stop".
Each distinct grammar is compiled once per engine (cached by its text) and copied per choice.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

# "Any JSON object", as OpenAI's json_object mode promises (an object at the top, not any JSON value).
JSON_OBJECT_SCHEMA = {"type": "object"}
# Compact JSON, no free whitespace between tokens: with it allowed, a small model's likeliest next token after
# `{"key":` was whitespace, for ever (tinylm greedy: 100 tokens of tabs, measured); `,` and `:` as separators.
JSON_OPTIONS = {"whitespace_flexible": False}
# Compiled grammars kept per engine: a batch uses one or a few schemas; a bound keeps a flood of distinct ones
# from growing memory without end (least recently used dropped first).
MAX_CACHED_GRAMMARS = 64


@dataclass(frozen=True)
class StructuredOutput:
    """What a request's output must follow: a JSON schema (as JSON text, its keys in the author's order: the
    properties are generated in that order, as OpenAI's structured outputs do) or any JSON object."""

    schema_text: str

    @classmethod
    def parse(cls, raw: Any, field: str = "structured_outputs") -> StructuredOutput | None:
        """vLLM's guided-decoding value (a dict, or that dict as JSON text); ValueError names the field."""
        name = f"sampling_parameters.{field}"
        if raw in (None, "", {}):
            return None
        if isinstance(raw, (str, bytes)):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise ValueError(f"{name} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError(f"{name} must be a JSON object")
        known = ("json", "json_object", "backend")
        unknown = sorted(k for k, v in raw.items() if k not in known and v not in (None, False))
        if unknown:
            raise ValueError(f"{name}: unsupported field(s) {', '.join(unknown)}")
        schema = raw.get("json")
        if schema is not None:
            if isinstance(schema, str):
                schema = json.loads(schema)
            if not isinstance(schema, dict):
                raise ValueError(f"{name}.json must be a JSON schema object")
            return cls(json.dumps(schema))
        if raw.get("json_object") is True:
            return cls(json.dumps(JSON_OBJECT_SCHEMA))
        raise ValueError(f"{name} needs `json` (a schema) or `json_object: true`")


class GrammarCompiler:
    """Per engine: the tokenizer prepared once for llguidance, and each distinct grammar compiled once."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import llguidance.hf

        self.vocab_size = vocab_size
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self._compiled: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()  # submit() compiles on the caller's thread; several may arrive at once

    def matcher(self, spec: StructuredOutput) -> GrammarMatcher:
        """A fresh matcher for one choice; ValueError when the grammar cannot be compiled."""
        import llguidance

        with self._lock:
            template = self._compiled.get(spec.schema_text)
            if template is None:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(spec.schema_text, overrides=JSON_OPTIONS)
                template = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
                if template.is_error():
                    raise ValueError(f"structured_outputs.json cannot be compiled: {template.get_error()}")
                self._compiled[spec.schema_text] = template
                while len(self._compiled) > MAX_CACHED_GRAMMARS:
                    self._compiled.popitem(last=False)
            self._compiled.move_to_end(spec.schema_text)
        return GrammarMatcher(template.deep_copy())


class GrammarMatcher:
    """One choice's position in its grammar."""

    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def mask(self, logits: torch.Tensor) -> None:
        """Set the logits of every token the grammar forbids next to -inf, in place (one row, [vocab]).

        A byte per token from llguidance (0 = forbidden), not llguidance.torch's bitmask helpers: those are
        wrapped in torch.compile, whose import and first call cost 7 s on this host (measured), inside the step
        loop that every running sequence waits on."""
        allowed = torch.frombuffer(bytearray(self._matcher.compute_logit_bias()), dtype=torch.uint8)
        forbidden = (allowed[: logits.shape[-1]] == 0).to(logits.device, non_blocking=True)  # logits may be on a GPU
        logits.masked_fill_(forbidden, float("-inf"))

    def advance(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id):
            # Only a token the mask allowed is ever taken, so this is a bug, not a user error.
            raise RuntimeError(f"the grammar refused token {token_id}: {self._matcher.get_error()}")

    @property
    def complete(self) -> bool:
        """The document is closed and nothing but EOS may follow."""
        return bool(self._matcher.is_stopped())
