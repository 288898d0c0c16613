"""Closed shards' rendered result lines, kept in the web process (results/live.py reads through it).

A follower polls every second, and one that keeps asking from a cursor behind (``after=0``, or two readers
of one batch) would have every poll read the same parts from storage and render the same stopped shards'
missing lines again. A closed shard's lines never change (its row names its committed part, and a stop's
reason is written once), so its rendering of one kind is kept here, once complete, keyed by everything it
was rendered from: the batch, the shard, its part, its status and the entry kind. No other batch, and so no
other tenant, can name another's entry; the view checks the tenant before any slice is taken.

Per process and bounded: least recently used entries go first once ``RESULTS_PART_CACHE_BYTES`` is held, and a
shard larger than an eighth of that is streamed from storage every time rather than pushing the rest out. 0
turns the cache off. Gunicorn's threads share it under one lock; a miss renders outside the lock."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import NamedTuple

from django.conf import settings

# What an entry costs beside its bytes (its key, the bytes object, the dict slot): an empty shard counts too.
ENTRY_OVERHEAD_BYTES = 256
# A shard above this fraction of the bound is never kept.
_LARGEST_ENTRY_FRACTION = 8


class PartKey(NamedTuple):
    batch_id: str
    shard_id: int
    part_name: str
    status: str
    entry_kind: str  # "out" or "err" (parts.py)


class _LinesLRU:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[PartKey, bytes] = OrderedDict()
        self._held = 0  # bytes, overhead included

    def get(self, key: PartKey) -> bytes | None:
        with self._lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
            return data

    def put(self, key: PartKey, data: bytes, *, bound: int) -> bool:
        cost = len(data) + ENTRY_OVERHEAD_BYTES
        if cost > bound // _LARGEST_ENTRY_FRACTION:
            return False
        with self._lock:
            old = self._entries.pop(key, None)  # two threads rendered the same shard: the same bytes
            if old is not None:
                self._held -= len(old) + ENTRY_OVERHEAD_BYTES
            self._entries[key] = data
            self._held += cost
            while self._held > bound:  # a lowered bound is met at the next put
                _, evicted = self._entries.popitem(last=False)
                self._held -= len(evicted) + ENTRY_OVERHEAD_BYTES
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    def held_bytes(self) -> int:
        with self._lock:
            return self._held


_cache = _LinesLRU()


def part_lines_get(key: PartKey) -> bytes | None:
    """The shard's whole rendered lines of the key's kind, if this process keeps them."""
    if settings.RESULTS_PART_CACHE_BYTES <= 0:
        return None
    return _cache.get(key)


def part_entry_limit() -> int:
    """The most bytes of one shard worth collecting while it is streamed (0: none is kept)."""
    bound = settings.RESULTS_PART_CACHE_BYTES
    return max(0, bound // _LARGEST_ENTRY_FRACTION - ENTRY_OVERHEAD_BYTES) if bound > 0 else 0


def part_lines_put(key: PartKey, data: bytes) -> bool:
    """Keep a closed shard's complete rendering (never a partial one, nor one whose part was lost); False when it
    is too large to keep or the cache is off."""
    bound = settings.RESULTS_PART_CACHE_BYTES
    return bound > 0 and _cache.put(key, data, bound=bound)


def part_cache_clear() -> None:
    _cache.clear()


def part_cache_held_bytes() -> int:
    return _cache.held_bytes()
