"""Prefix cache for the continuous-batching engine: the KV of whole prompt blocks, found again by a hash chain
over their token ids (vLLM's automatic prefix caching, in miniature). A block's key covers every token before
it, so a hit on block i means the whole prefix up to block i matches.

Its blocks are segments of the engine's KV pool, so they count against the KV budget like running sequences
do; the engine evicts least recently used blocks when a new sequence needs the room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any


def block_keys(token_ids: Sequence[int], block_size: int, salt: str = "") -> list[int]:
    """One key per whole block of `token_ids`; key i depends on blocks 0..i and on `salt` (the LoRA adapter the
    KV was computed with: cb_lora.py), so a prefix never matches across adapters."""
    keys, previous = [], hash(("lora", salt)) if salt else 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        previous = hash((previous, tuple(token_ids[start : start + block_size])))
        keys.append(previous)
    return keys


class PrefixCache:
    def __init__(self, pool: Any, block_size: int) -> None:
        self.pool, self.block_size = pool, block_size
        self._blocks: OrderedDict[int, int] = OrderedDict()  # chain key → pool slot; least recently used first
        self.hits_tokens = 0  # prompt tokens served from the cache since start (for tests and metrics)

    @property
    def held_tokens(self) -> int:
        return len(self._blocks) * self.block_size

    def holds(self, key: int) -> bool:
        return key in self._blocks

    def lookup(self, token_ids: Sequence[int], salt: str = "") -> tuple[int, list[int]]:
        """The cached blocks of the longest cached prefix, leaving at least one prompt token to compute (the
        model needs it to produce the next token's logits), and the key of the last one (0 for none): prompts
        with the same key share the same cached prefix."""
        usable = (len(token_ids) - 1) // self.block_size
        found = []
        for key in block_keys(token_ids, self.block_size, salt)[:usable]:
            block = self._blocks.get(key)
            if block is None:
                break
            found.append((key, block))
        # Touch children before parents, so that eviction (oldest first) drops the tail of a chain first and
        # never leaves a child that no lookup can reach.
        for key, _ in reversed(found):
            self._blocks.move_to_end(key)
        self.hits_tokens += len(found) * self.block_size
        return (found[-1][0] if found else 0), [block for _, block in found]

    def insert(self, token_ids: Sequence[int], source: int, salt: str = "") -> None:
        """Keep the whole blocks of a prefilled prompt whose KV sits in the pool from slot `source`, as far as
        the pool has free room (a cache never evicts running work)."""
        keys = block_keys(token_ids, self.block_size, salt)
        for index, key in enumerate(keys):  # parents first: a child is unreachable without them
            if key in self._blocks:
                continue
            slot = self.pool.allocate(self.block_size)
            if slot is None:
                break
            self.pool.copy(source + index * self.block_size, slot, self.block_size)
            self._blocks[key] = slot
        for key in reversed(keys):  # children touched first, so parents are the most recent and outlive them
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def evict(self, tokens: int) -> int:
        """Drop least recently used blocks until `tokens` are freed or nothing is left; returns tokens freed."""
        freed = 0
        while freed < tokens and self._blocks:
            _, slot = self._blocks.popitem(last=False)
            self.pool.release(slot, self.block_size)
            freed += self.block_size
        return freed
