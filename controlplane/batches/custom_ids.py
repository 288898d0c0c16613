"""Finding duplicate custom_ids in a file of any size with little memory.

Validation used to keep a dict from each id's 16-byte digest to its line: ~110 bytes per request, 144 MB of a
worker's memory for a million-line file (docs/PERFORMANCE.md). Here each request costs ~20 bytes: its digest
goes into one bytearray and its line number into an array; the duplicates are found once, after the pass, by
sorting the digests. To quote a duplicate's id in its error without reading the file again, a bitmap
remembers which digests may have been seen: a line whose bit is already set keeps its id aside (every true
duplicate does, plus a few percent of other lines by chance).
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np

# Bits per line in the "maybe seen" bitmap: at 16, chance hits stay under ~6 % of lines. It starts small and
# doubles (rebuilt from the digests) as the file grows, up to 2**27 bits (16 MiB).
_BITS_PER_LINE = 16
_FIRST_BITS = 2**17
_MAX_BITS = 2**27
_blake2b = hashlib.blake2b  # looked up once: add() runs for every line of every file


class CustomIds:
    def __init__(self) -> None:
        self._seen = bytearray(_FIRST_BITS // 8)
        self._mask = _FIRST_BITS - 1
        self._digests = bytearray()
        self._lines = array("I")
        self._maybe: dict[int, str] = {}  # line → id, for lines whose bit was already set
        self._grow_at = self._grow_threshold()

    def _grow_threshold(self) -> int:
        """Lines past which the bitmap doubles (none once it is at its largest)."""
        bits = len(self._seen) * 8
        return bits // _BITS_PER_LINE if bits < _MAX_BITS else 2**63

    def add(self, custom_id: str, line: int) -> None:
        digest = _blake2b(custom_id.encode(), digest_size=16).digest()
        bit = int.from_bytes(digest, "little") & self._mask  # the low bits: the first 4 bytes, as _grow reads them
        byte, flag = bit >> 3, 1 << (bit & 7)
        if self._seen[byte] & flag:
            self._maybe[line] = custom_id
        else:
            self._seen[byte] |= flag
        self._digests += digest
        self._lines.append(line)
        if len(self._lines) > self._grow_at:
            self._grow()

    def _grow(self) -> None:
        """Twice the bits, set again from every digest so far (amortised: each doubling reads them all once)."""
        bits = len(self._seen) * 16
        # A view, not a copy (a copy of the digests was ~80 MB at 5M lines); it is gone before the next add.
        values = np.frombuffer(self._digests, dtype="<u4")[::4] & np.uint32(bits - 1)
        seen = np.zeros(bits // 8, dtype=np.uint8)
        np.bitwise_or.at(seen, values >> 3, (1 << (values & 7)).astype(np.uint8))
        self._seen, self._mask = bytearray(seen.tobytes()), bits - 1
        self._grow_at = self._grow_threshold()

    def duplicates(self) -> list[tuple[int, int, str]]:
        """``(line, first line with the same id, the id)`` for every line whose id an earlier line used, in
        line order."""
        count = len(self._lines)
        if count < 2 or not self._maybe:
            return []
        keys = np.frombuffer(self._digests, dtype=np.uint64).reshape(count, 2)  # a view: no copy
        # Sorted on the first 8 bytes only, stable (lines of one id stay in file order): half the memory of
        # sorting all 16 (a 1 GB file of 5.2M lines peaked at +500 MB here before). Two ids that share those
        # bytes (~1e-6 at millions of lines) make the full sort run instead, so no duplicate is ever missed.
        order = np.argsort(keys[:, 0], kind="stable")
        firsts_sorted = keys[order, 0]
        same = firsts_sorted[1:] == firsts_sorted[:-1]
        del firsts_sorted
        if not same.any():
            return []
        at = np.flatnonzero(same)
        if not np.array_equal(keys[order[at], 1], keys[order[at + 1], 1]):
            order = np.lexsort((keys[:, 1], keys[:, 0]))
            ordered = keys[order]
            same = (ordered[1:] == ordered[:-1]).all(axis=1)
            del ordered
        first_of_group = np.concatenate(([True], ~same))
        group = np.cumsum(first_of_group) - 1
        lines = np.frombuffer(self._lines, dtype=np.uint32)[order]
        firsts = lines[np.flatnonzero(first_of_group)]
        repeats = np.flatnonzero(~first_of_group)
        found = zip(lines[repeats].tolist(), firsts[group[repeats]].tolist(), strict=True)
        return sorted((line, first, self._maybe[line]) for line, first in found)
