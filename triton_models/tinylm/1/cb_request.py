"""What the engine (cb_engine.py) keeps per request and per choice: a request's n completions, their text,
tokens, KV segment and sampling state, read by the caller's ``on_update``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from cb_grammar import GrammarMatcher
from cb_sampling import SamplingParams, TokenPick


@dataclass(eq=False)
class Choice:
    """One of a request's n completions. Read it inside `on_update`; the engine thread owns it."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", "abort"
    picks: list[TokenPick] = field(default_factory=list)  # per generated token, when logprobs were asked
    cumulative_logprob: float = 0.0
    stable_chars: int = 0  # text[:stable_chars] can no longer change (a stop string may still cut the rest)
    # engine state
    start: int = -1  # its segment of the KV pool (prompt + max_tokens slots), -1 when it has none
    length: int = 0  # tokens whose KV is in the segment
    generator: torch.Generator | None = field(default=None, repr=False)
    counts: torch.Tensor | None = field(default=None, repr=False)
    grammar: GrammarMatcher | None = field(default=None, repr=False)  # when the output must follow JSON


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    on_update: Callable[[Request], None]
    is_cancelled: Callable[[], bool] | None = None
    stream: bool = False  # keep each choice's text current every step (else only with stop strings, and at the end)
    choices: list[Choice] = field(default_factory=list)
    num_cached_tokens: int = 0
    finished: bool = False
    error: str | None = None  # set with finished when the engine failed this request
    reserved_tokens: int = 0

    @property
    def cancelled(self) -> bool:
        return self.finished and any(c.finish_reason == "abort" for c in self.choices)
