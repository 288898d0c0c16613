"""Per-request sampling for the continuous-batching engine: parameters, penalties, temperature/top-p, seeds,
logprobs. Plain torch, no Triton, no transformers.

The parameter names and meanings are vLLM's `SamplingParams` (what Triton's vLLM backend parses from its
`sampling_parameters` JSON input), so one request body drives this CPU engine and vLLM on a GPU alike.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any

import torch
from cb_grammar import StructuredOutput

# vLLM keys this engine does not implement but that are harmless to receive at their defaults; anything else
# unknown is an error, as vLLM's SamplingParams(**json) raises on an unknown keyword.
_IGNORED_AT_DEFAULT = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "top_k": -1, "min_p": 0.0}


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16  # vLLM's default
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None  # same seed + same request → same output, whatever else shares the batch
    stop: tuple[str, ...] = ()  # cut before the first occurrence; finish_reason "stop"
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = None  # vLLM: top-k logprobs per generated token (plus the sampled one); 0 = only it
    ignore_eos: bool = False
    structured_outputs: StructuredOutput | None = None  # vLLM's field: JSON (a schema or any object) to follow

    @classmethod
    def from_json(cls, text: str | bytes | None) -> SamplingParams:
        """Parse and validate the `sampling_parameters` JSON; ValueError names the offending field."""
        if text in (None, b"", ""):
            return cls()
        try:
            raw = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"sampling_parameters is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ValueError("sampling_parameters must be a JSON object")
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SamplingParams:
        raw = dict(raw)
        for key, default in _IGNORED_AT_DEFAULT.items():
            if key in raw and raw.pop(key) not in (default, None):
                raise ValueError(f"sampling_parameters.{key} is not supported by this engine")
        # vLLM's two names for it: guided_decoding (every vLLM backend release) and structured_outputs (newer).
        guided_field = "guided_decoding" if raw.get("guided_decoding") not in (None, "", {}) else "structured_outputs"
        guided = StructuredOutput.parse(raw.pop("guided_decoding", None) or raw.get("structured_outputs"), guided_field)
        unknown = sorted(set(raw) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"sampling_parameters: unknown field(s) {', '.join(unknown)}")
        stop = raw.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ValueError("sampling_parameters.stop must be a non-empty string or a list of them")
        params = cls(
            max_tokens=_number(raw, "max_tokens", int, 16),
            temperature=_number(raw, "temperature", float, 1.0),
            top_p=_number(raw, "top_p", float, 1.0),
            seed=_number(raw, "seed", int, None),
            stop=tuple(stop),
            n=_number(raw, "n", int, 1),
            presence_penalty=_number(raw, "presence_penalty", float, 0.0),
            frequency_penalty=_number(raw, "frequency_penalty", float, 0.0),
            logprobs=_number(raw, "logprobs", int, None),
            ignore_eos=bool(raw.get("ignore_eos", False)),
            structured_outputs=guided,
        )
        params.validate()
        return params

    def validate(self) -> None:
        checks = [
            (self.max_tokens >= 1, "max_tokens must be >= 1"),
            (0.0 <= self.temperature <= 2.0, "temperature must be in [0, 2]"),
            (0.0 < self.top_p <= 1.0, "top_p must be in (0, 1]"),
            (1 <= self.n <= 128, "n must be in [1, 128]"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty must be in [-2, 2]"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty must be in [-2, 2]"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be in [0, 20]"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"sampling_parameters.{message}")


def _number(raw: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = raw.get(key, default)
    if value is None:
        return default
    # bool is an int in Python; `"n": true` is a client bug, not 1.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise ValueError(f"sampling_parameters.{key} must be a{'n integer' if kind is int else ' number'}")
    return kind(value)


def choice_generator(seed: int | None, choice_index: int) -> torch.Generator:
    """A private RNG per choice: drawing from it never depends on which other sequences share the step, so a
    seeded request repeats; the n choices of one request get different streams from the one seed."""
    if seed is None:
        stream_seed = int.from_bytes(os.urandom(8), "little") >> 1
    else:
        stream_seed = random.Random(f"{seed}:{choice_index}").getrandbits(63)
    return torch.Generator().manual_seed(stream_seed)


@dataclass
class TokenPick:
    token_id: int
    logprob: float
    # token id → (logprob, rank): the sampled token plus the top-k asked for (vLLM's logprobs entry)
    top: dict[int, tuple[float, int]] = field(default_factory=dict)


def pick_tokens(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator],
    counts: list[torch.Tensor | None],
    grammars: list[Any] | None = None,
) -> list[TokenPick]:
    """One next token per row of `logits` [rows, vocab], each row with its own parameters, RNG and counts of the
    tokens it generated so far (for the penalties; None for rows without penalties), and its grammar matcher
    (cb_grammar.GrammarMatcher; None for free text) whose mask applies before greedy or sampled picking."""
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)  # reported logprobs: the model's, before any processing
    adjusted = logits.clone()
    for row, p in enumerate(params):
        if counts[row] is not None:
            # OpenAI's formula: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence
            c = counts[row]
            adjusted[row] -= c * p.frequency_penalty + (c > 0).float() * p.presence_penalty
    for row, grammar in enumerate(grammars or ()):
        if grammar is not None:
            grammar.mask(adjusted[row])  # forbidden tokens at -inf: greedy never takes them, sampling gives them 0
    greedy = adjusted.argmax(dim=-1).tolist()
    picks = []
    for row, p in enumerate(params):
        token = greedy[row] if p.temperature == 0.0 else _sample(adjusted[row], p, generators[row])
        picks.append(TokenPick(token_id=token, logprob=float(raw_logprobs[row, token])))
        if p.logprobs is not None:
            picks[-1].top = _top_logprobs(raw_logprobs[row], token, p.logprobs)
    return picks


def _sample(row_logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
    probs = torch.softmax(row_logits / p.temperature, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest set whose mass reaches top_p (the first token always stays).
        drop = (sorted_probs.cumsum(0) - sorted_probs) >= p.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def _top_logprobs(row: torch.Tensor, token: int, k: int) -> dict[int, tuple[float, int]]:
    def rank(token_id: int) -> int:
        return int((row > row[token_id]).sum()) + 1

    top = {token: (float(row[token]), rank(token))}
    if k:
        values, ids = row.topk(k)
        for position, (value, token_id) in enumerate(zip(values.tolist(), ids.tolist(), strict=True)):
            top.setdefault(token_id, (value, position + 1))
    return top
