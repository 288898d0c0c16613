"""How the engine splits one step's admitted requests into prefill passes (cb_engine.py): rounds, so that prompts
sharing uncached prefix blocks compute them once, and passes of similar lengths, so that padding stays small."""

from __future__ import annotations

from typing import Any

from cb_prefix import PrefixCache, block_keys


def prefill_rounds(admitted: list[Any], prefix_cache: PrefixCache) -> tuple[list[Any], list[Any]]:
    """(first round, second round): a request whose first uncached block an earlier request of the step will
    cache waits for the second round, where it starts from that request's blocks."""
    first: list[Any] = []
    later: list[Any] = []
    coming: set[int] = set()  # blocks the first round will cache
    for request in admitted:
        keys = block_keys(request.prompt_token_ids, prefix_cache.block_size, request.cache_salt)
        new = [key for key in keys if not prefix_cache.holds(key)]
        (later if new and new[0] in coming else first).append(request)
        coming.update(new)
    return first, later


# A prefill pass pads every row to its longest: rows are passed together while the padding stays under this share
# of their tokens. On the real corpus (prompts of 36-370 tokens) one pass per step padded 5,033 prompt tokens to
# 6,816 (+35%), and a prefill token costs the same padded or not; a pass more costs only its fixed overhead.
PREFILL_PADDING = 0.1


def similar_lengths(requests: list[Any], cached: int) -> list[list[Any]]:
    """The requests (sharing `cached` prefix tokens) in passes of similar tail lengths, shortest first."""
    passes: list[list[Any]] = []
    current: list[Any] = []
    tokens = 0
    for request in sorted(requests, key=lambda r: len(r.prompt_token_ids)):
        tail = len(request.prompt_token_ids) - cached  # the longest so far: sorted
        if current and tail * (len(current) + 1) > (1 + PREFILL_PADDING) * (tokens + tail):
            passes.append(current)
            current, tokens = [], 0
        current.append(request)
        tokens += tail
    return [*passes, current] if current else passes
