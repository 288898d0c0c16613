"""What the engine (cb_engine.py) keeps per request and per choice: a request's n completions, their text,
tokens, KV segment and sampling state, read by the caller's ``on_update``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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
    adapter: Any = None  # the cb_lora.Adapter its sequences run, None for the base

    @property
    def cache_salt(self) -> str:
        """What the prefix cache's keys are salted with: KV computed under one adapter is not another's."""
        return self.adapter.key if self.adapter is not None else ""

    @property
    def cancelled(self) -> bool:
        return self.finished and any(c.finish_reason == "abort" for c in self.choices)


def append_token(request: Request, choice: Choice, pick: TokenPick, tokenizer: Any, eos_token_ids: set[int]) -> None:
    """Add a sampled token to a choice: its counts, logprobs, grammar, text (when read), and why it ends."""
    params = request.params
    choice.token_ids.append(pick.token_id)
    if choice.counts is not None:
        choice.counts[pick.token_id] += 1
    choice.cumulative_logprob += pick.logprob
    if params.logprobs is not None:
        choice.picks.append(pick)
    took_eos = pick.token_id in eos_token_ids and not params.ignore_eos
    if choice.grammar is not None and not took_eos:
        choice.grammar.advance(pick.token_id)
    # The document is closed: end here with "stop", as at EOS (the mask would allow only EOS next).
    is_eos = took_eos or (choice.grammar is not None and choice.grammar.complete)
    at_limit = len(choice.token_ids) >= params.max_tokens
    if is_eos or at_limit or params.stop or request.stream:
        # Decoding costs O(length): done only when someone reads the text before the end, or at the end.
        choice.text = tokenizer.decode(
            choice.token_ids[:-1] if took_eos else choice.token_ids, skip_special_tokens=True
        )
    cut = min((i for i in (choice.text.find(s) for s in params.stop) if i >= 0), default=-1)
    if cut >= 0:
        choice.text, choice.finish_reason = choice.text[:cut], "stop"
    elif is_eos:
        choice.finish_reason = "stop"
    elif at_limit:
        choice.finish_reason = "length"
    hold = max((len(s) - 1 for s in params.stop), default=0)
    choice.stable_chars = len(choice.text) if choice.finish_reason else max(0, len(choice.text) - hold)
