"""Constrained-decoding libraries side by side on tinylm's tokenizer, to pick one by measurement.

For each candidate installed in this venv (xgrammar, llguidance, outlines-core, lm-format-enforcer), on the
byte-level BPE tokenizer of triton_models/tinylm/1/hf and a realistic schema (an object with a string, an integer
array and an enum):

- ``compile_ms``: compiling the schema into a matcher (tokenizer preparation excluded, timed apart as
  ``tokenizer_ms``), and ``json_object_ms`` for the any-JSON-object grammar;
- ``mask_us``: per-token cost of a decode step, i.e. computing the allowed-token mask and advancing by the token
  taken, walking a valid document token by token (median over the document; every step checks the document's
  token is allowed, and at the end that only EOS is, so a wrong matcher fails here rather than looking fast);
- ``install_mb``: the package and the dependencies it brought beyond what the project already has;
- ``extra_deps``: those dependencies.

Ends with one parseable line:

    CONSTRAINED pick=… <lib>_compile_ms=… <lib>_mask_us=… …

    .venv/bin/python bench/constrained.py [--hf-dir triton_models/tinylm/1/hf] [--repeat 5]

Figures in docs/performance.md; the choice in docs/architecture/generation.md ("Constrained decoding").
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "numbers": {"type": "array", "items": {"type": "integer"}},
        "kind": {"enum": ["even", "odd", "mixed"]},
    },
    "required": ["name", "numbers", "kind"],
    "additionalProperties": False,
}
# Compact (no whitespace): what every library accepts, and the form the engine's grammar allows.
DOCUMENT = json.dumps(
    {"name": "count from 3 to 9", "numbers": [3, 4, 5, 6, 7, 8, 9], "kind": "mixed"}, separators=(",", ":")
)
# Distribution name → dependencies it pulls that the project did not already have (checked with pip at install
# time on this venv; torch, numpy, pydantic, transformers were there already).
CANDIDATES = {
    "xgrammar": ["apache-tvm-ffi", "triton"],
    "llguidance": [],
    "outlines-core": [],
    "lm-format-enforcer": ["interegular"],
}


def _size_mb(distributions: list[str]) -> float:
    total = 0
    for name in distributions:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        total += sum(f.size or 0 for f in files)
    return round(total / 1e6, 1)


class _Walk:
    """A matcher's two operations: `allowed()` → set-membership test for a token id; `advance(token)`."""

    def __init__(self, allowed: Callable[[], Callable[[int], bool]], advance: Callable[[int], None]) -> None:
        self.allowed, self.advance = allowed, advance


Compile = Callable[[str | None], Callable[[], _Walk]]


def _xgrammar(tokenizer: Any, vocab: int) -> Compile:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    return lambda schema: _xgrammar_compiled(xgrammar, info, vocab, schema)


def _xgrammar_compiled(xgrammar: Any, info: Any, vocab: int, schema: str | None) -> Callable[[], _Walk]:
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    compiled = compiler.compile_json_schema(schema) if schema else compiler.compile_builtin_json_grammar()

    def walk() -> _Walk:
        matcher = xgrammar.GrammarMatcher(compiled)
        bitmask = xgrammar.allocate_token_bitmask(1, vocab)

        def allowed() -> Callable[[int], bool]:
            matcher.fill_next_token_bitmask(bitmask)
            words = bitmask[0]
            return lambda t: bool((int(words[t // 32]) >> (t % 32)) & 1)

        return _Walk(allowed, lambda t: _check(matcher.accept_token(t)))

    return walk


def _llguidance(tokenizer: Any, vocab: int) -> Compile:
    import llguidance.hf

    lltok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    return lambda schema: _llguidance_compiled(lltok, vocab, schema)


def _llguidance_compiled(lltok: Any, vocab: int, schema: str | None) -> Callable[[], _Walk]:
    import llguidance

    # As the engine does (cb_grammar.py): compact JSON, a template matcher copied per sequence.
    options = {"whitespace_flexible": False}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(schema or '{"type": "object"}', overrides=options)
    template = llguidance.LLMatcher(lltok, grammar, log_level=0)
    template.compute_logit_bias()  # llguidance builds its lexer lazily: the first mask is part of compiling

    def walk() -> _Walk:
        matcher = template.deep_copy()

        def allowed() -> Callable[[int], bool]:
            bias = matcher.compute_logit_bias()
            return lambda t: bias[t] != 0

        return _Walk(allowed, lambda t: _check(matcher.consume_token(t)))

    return walk


def _outlines_core(tokenizer: Any, vocab: int) -> Compile:
    from outlines_core import Vocabulary

    eos = tokenizer.eos_token_id
    byte_of = {v: k for k, v in _bytes_to_unicode().items()}
    mapping: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id != eos and token not in tokenizer.all_special_tokens:
            mapping.setdefault(bytes(byte_of[c] for c in token), []).append(token_id)
    vocabulary = Vocabulary(eos, mapping)
    return lambda schema: _outlines_core_compiled(vocabulary, schema)


def _outlines_core_compiled(vocabulary: Any, schema: str | None) -> Callable[[], _Walk]:
    from outlines_core import Guide, Index
    from outlines_core.json_schema import build_regex_from_schema

    index = Index(build_regex_from_schema(schema or '{"type": "object"}'), vocabulary)

    def walk() -> _Walk:
        guide = Guide(index)

        def allowed() -> Callable[[int], bool]:
            tokens = set(guide.get_tokens())
            return tokens.__contains__

        return _Walk(allowed, lambda t: _check(guide.advance(t) is not None))

    return walk


def _lm_format_enforcer(tokenizer: Any, vocab: int) -> Compile:
    import sys
    import types

    import transformers

    # lm-format-enforcer 0.11.3 imports transformers.tokenization_utils, which transformers 5 removed: shimmed
    # here so it can be measured at all (in the engine that would be a patch to carry, a point against it).
    shim = types.ModuleType("transformers.tokenization_utils")
    shim.PreTrainedTokenizerBase = transformers.PreTrainedTokenizerBase  # type: ignore[attr-defined]
    sys.modules.setdefault("transformers.tokenization_utils", shim)
    from lmformatenforcer.integrations.transformers import build_token_enforcer_tokenizer_data

    data = build_token_enforcer_tokenizer_data(tokenizer, vocab_size=vocab)
    return lambda schema: _lm_format_enforcer_compiled(data, schema)


def _lm_format_enforcer_compiled(data: Any, schema: str | None) -> Callable[[], _Walk]:
    from lmformatenforcer import JsonSchemaParser, TokenEnforcer

    parsed = json.loads(schema) if schema else None

    def walk() -> _Walk:
        enforcer = TokenEnforcer(data, JsonSchemaParser(parsed))
        prefix: list[int] = []

        def allowed() -> Callable[[int], bool]:
            tokens = enforcer.get_allowed_tokens(prefix)
            if not tokens.use_bitmask:
                return set(tokens.allowed_tokens).__contains__
            words = tokens.allowed_tokens
            return lambda t: bool((int(words[t // 32]) >> (t % 32)) & 1)

        return _Walk(allowed, prefix.append)

    return walk


def _check(ok: Any) -> None:
    if ok is False:
        raise AssertionError("the matcher refused a token of a valid document")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(c) for c in chars), strict=True))


BUILDERS: dict[str, Callable[[Any, int], Compile]] = {
    "xgrammar": _xgrammar,
    "llguidance": _llguidance,
    "outlines-core": _outlines_core,
    "lm-format-enforcer": _lm_format_enforcer,
}


def measure(name: str, tokenizer: Any, vocab: int, repeat: int) -> dict[str, Any]:
    builder = BUILDERS[name]
    document = tokenizer(DOCUMENT, add_special_tokens=False)["input_ids"]
    tokenizer_s, compile_s, object_s, steps = [], [], [], []
    for _ in range(repeat):
        started = time.perf_counter()
        compile_grammar = builder(tokenizer, vocab)
        tokenizer_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        walk_factory = compile_grammar(json.dumps(SCHEMA))
        compile_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        compile_grammar(None)
        object_s.append(time.perf_counter() - started)
        walk = walk_factory()
        for token in document:
            started = time.perf_counter()
            is_allowed = walk.allowed()
            ok = is_allowed(token)
            walk.advance(token)
            steps.append(time.perf_counter() - started)
            if not ok:
                raise AssertionError(f"{name}: token {token} of the document was masked out")
        if not walk.allowed()(tokenizer.eos_token_id):
            raise AssertionError(f"{name}: EOS not allowed after a complete document")
    return {
        "tokenizer_ms": round(statistics.median(tokenizer_s) * 1e3, 1),
        "compile_ms": round(statistics.median(compile_s) * 1e3, 1),
        "json_object_ms": round(statistics.median(object_s) * 1e3, 1),
        "mask_us": round(statistics.median(steps) * 1e6, 1),
        "install_mb": _size_mb([name, *CANDIDATES[name]]),
        "extra_deps": ",".join(CANDIDATES[name]) or "-",
        "version": importlib.metadata.version(name),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf-dir", type=Path, default=REPO_ROOT / "triton_models" / "tinylm" / "1" / "hf")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pick", default="llguidance", help="the library the engine uses (cb_grammar.py)")
    args = parser.parse_args()
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.hf_dir)
    vocab = AutoConfig.from_pretrained(args.hf_dir).vocab_size
    rows = {}
    for name in CANDIDATES:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # only the pick stays installed; the others are measured when installed by hand
        rows[name] = measure(name, tokenizer, vocab, args.repeat)
    columns = ["version", "tokenizer_ms", "compile_ms", "json_object_ms", "mask_us", "install_mb", "extra_deps"]
    print(f"{'library':<20}" + "".join(f"{c:>16}" for c in columns[:-1]) + f"  {columns[-1]}")
    for name, row in rows.items():
        print(f"{name:<20}" + "".join(f"{row[c]!s:>16}" for c in columns[:-1]) + f"  {row[columns[-1]]}")
    figures = " ".join(
        f"{name.replace('-', '_')}_{key}={row[key]}" for name, row in rows.items() for key in ("compile_ms", "mask_us")
    )
    print(
        f"CONSTRAINED pick={args.pick} vocab={vocab} document_tokens={len(tokenizer(DOCUMENT)['input_ids'])} {figures}"
    )


if __name__ == "__main__":
    main()
