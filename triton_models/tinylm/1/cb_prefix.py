"""Prefix cache for the continuous-batching engine: the KV of whole prompt blocks, found again by a hash chain
over their token ids (vLLM's automatic prefix caching, in miniature). A block's key covers every token before
it, so a hit on block i means the whole prefix up to block i matches.

Its blocks count against the engine's KV budget like running sequences do; the engine evicts least recently
used blocks when a new sequence needs the room.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch

# Per layer: (keys, values), each [kv_heads, block_size, head_dim].
BlockKV = list[tuple[torch.Tensor, torch.Tensor]]


def block_keys(token_ids: Sequence[int], block_size: int) -> list[int]:
    """One key per whole block of `token_ids`; key i depends on blocks 0..i."""
    keys, previous = [], 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        previous = hash((previous, tuple(token_ids[start : start + block_size])))
        keys.append(previous)
    return keys


class PrefixCache:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._blocks: OrderedDict[int, BlockKV] = OrderedDict()  # least recently used first
        self.hits_tokens = 0  # prompt tokens served from the cache since start (for tests and metrics)

    @property
    def held_tokens(self) -> int:
        return len(self._blocks) * self.block_size

    def lookup(self, token_ids: Sequence[int]) -> list[BlockKV]:
        """The cached blocks of the longest cached prefix, leaving at least one prompt token to compute (the
        model needs it to produce the next token's logits)."""
        usable = (len(token_ids) - 1) // self.block_size
        found = []
        for key in block_keys(token_ids, self.block_size)[:usable]:
            block = self._blocks.get(key)
            if block is None:
                break
            found.append((key, block))
        # Touch children before parents, so that eviction (oldest first) drops the tail of a chain first and
        # never leaves a child that no lookup can reach.
        for key, _ in reversed(found):
            self._blocks.move_to_end(key)
        self.hits_tokens += len(found) * self.block_size
        return [block for _, block in found]

    def insert(self, token_ids: Sequence[int], kv: list[tuple[torch.Tensor, torch.Tensor]], room_tokens: int) -> None:
        """Keep the whole blocks of a prefilled prompt (`kv` per layer: [kv_heads, >= len, head_dim]), at most
        `room_tokens` worth of new blocks."""
        keys = block_keys(token_ids, self.block_size)
        for index, key in enumerate(keys):  # parents first: a child is unreachable without them
            if key in self._blocks:
                continue
            if room_tokens < self.block_size:
                break
            start, end = index * self.block_size, (index + 1) * self.block_size
            self._blocks[key] = [(k[:, start:end].clone(), v[:, start:end].clone()) for k, v in kv]
            room_tokens -= self.block_size
        for key in reversed(keys):  # children touched first, so parents are the most recent and outlive them
            if key in self._blocks:
                self._blocks.move_to_end(key)

    def evict(self, tokens: int) -> int:
        """Drop least recently used blocks until `tokens` are freed or nothing is left; returns tokens freed."""
        freed = 0
        while freed < tokens and self._blocks:
            self._blocks.popitem(last=False)
            freed += self.block_size
        return freed
