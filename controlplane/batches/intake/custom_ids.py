"""Finding duplicate custom_ids in a file of any size with little, bounded memory.

Validation used to keep a dict from each id's 16-byte digest to its line: ~110 bytes per request, 144 MB of a
worker's memory for a million-line file (docs/performance.md). Here each request is a 20-byte record (its
digest and line number); the duplicates are found once, after the pass, by sorting the records. To quote a
duplicate's id in its error without reading the file again, a bitmap remembers which digests may have been
seen: a line whose bit is already set keeps its id aside (every true duplicate does, plus a few percent of
other lines by chance).

Records stay in memory up to ``SPILL_AT`` lines (every file of up to a million requests). Past that they are
partitioned by a digest byte into ``BUCKETS`` unnamed temporary files, and the duplicates are found one
bucket at a time (an id's records all land in one bucket), so a 1 GB file costs the same few tens of MB as
a million-line one: the bitmap at its largest, the bucket buffers, and the sort of one bucket.
"""

from __future__ import annotations

import hashlib
import tempfile
from typing import IO

import numpy as np

# Bits per line in the "maybe seen" bitmap: at 16, chance hits stay under ~6 % of lines. It starts small and
# doubles (rebuilt from the digests) as the file grows, up to 2**27 bits (16 MiB).
_BITS_PER_LINE = 16
_FIRST_BITS = 2**17
_MAX_BITS = 2**27
_blake2b = hashlib.blake2b  # looked up once: add() runs for every line of every file

# 2**20 lines: 20 MB of records in memory at most. Past it they spill to BUCKETS files, each buffered up to
# BUCKET_BUFFER bytes (64 × 256 KiB = 16 MiB at most); a 5.2M-line file leaves ~1.6 MB per bucket to sort.
SPILL_AT = 2**20
BUCKETS = 64
BUCKET_BUFFER = 256 * 1024
_RECORD = np.dtype([("d0", "<u8"), ("d1", "<u8"), ("line", "<u4")])  # 20 bytes, no padding


class CustomIds:
    def __init__(self) -> None:
        self._seen = bytearray(_FIRST_BITS // 8)
        self._mask = _FIRST_BITS - 1
        self._records = bytearray()  # _RECORD rows while in memory
        self._count = 0
        self._maybe: dict[int, str] = {}  # line → id, for lines whose bit was already set
        self._grow_at = self._grow_threshold()
        self._buffers: list[bytearray] | None = None  # per bucket, once spilled
        self._files: list[IO[bytes]] = []

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
        record = digest + line.to_bytes(4, "little")
        self._count += 1
        if self._buffers is not None:
            index = digest[15] % BUCKETS
            bucket = self._buffers[index]
            bucket += record
            if len(bucket) >= BUCKET_BUFFER:
                self._flush(index)
            return
        self._records += record
        if self._count > self._grow_at:
            self._grow(len(self._seen) * 16)
        if self._count >= SPILL_AT:
            self._spill()

    def _grow(self, bits: int) -> None:
        """``bits`` bits, set again from every digest so far (amortised: each doubling reads them all once)."""
        # A view, not a copy; it is gone before the next add.
        values = np.frombuffer(self._records, dtype=_RECORD)["d0"].astype(np.uint32) & np.uint32(bits - 1)
        seen = np.zeros(bits // 8, dtype=np.uint8)
        np.bitwise_or.at(seen, values >> 3, (1 << (values & 7)).astype(np.uint8))
        self._seen, self._mask = bytearray(seen.tobytes()), bits - 1
        self._grow_at = self._grow_threshold()

    def _spill(self) -> None:
        """From here on records go to the bucket files; the bitmap takes its final size now, since it can
        only be rebuilt from records in memory."""
        if len(self._seen) * 8 < _MAX_BITS:
            self._grow(_MAX_BITS)
        records = np.frombuffer(self._records, dtype=_RECORD)
        buckets = (records["d1"] >> np.uint64(56)).astype(np.uint8) % BUCKETS  # digest[15]
        # Unnamed files (unlinked at creation), closed in duplicates() or with this object: nothing to clean up.
        self._files = [tempfile.TemporaryFile(prefix="custom-ids-") for _ in range(BUCKETS)]  # noqa: SIM115
        for index in range(BUCKETS):
            self._files[index].write(records[buckets == index].tobytes())
        del records, buckets
        self._records = bytearray()
        self._buffers = [bytearray() for _ in range(BUCKETS)]

    def _flush(self, index: int) -> None:
        assert self._buffers is not None
        self._files[index].write(self._buffers[index])
        self._buffers[index] = bytearray()

    def duplicates(self) -> list[tuple[int, int, str]]:
        """``(line, first line with the same id, the id)`` for every line whose id an earlier line used, in
        line order."""
        if self._count < 2 or not self._maybe:
            return []
        if self._buffers is None:
            found = _duplicates_of(np.frombuffer(self._records, dtype=_RECORD))  # a view: no copy
        else:
            found = []
            for index, file in enumerate(self._files):
                self._flush(index)
                file.seek(0)
                found += _duplicates_of(np.frombuffer(file.read(), dtype=_RECORD))
                file.close()
            self._files, self._buffers = [], [bytearray() for _ in range(BUCKETS)]
        return sorted((line, first, self._maybe[line]) for line, first in found)


def _duplicates_of(records: np.ndarray) -> list[tuple[int, int]]:
    """``(line, first line)`` pairs among records kept in line order."""
    if len(records) < 2:
        return []
    # Sorted on the first 8 bytes only, stable (lines of one id stay in file order): half the memory of
    # sorting all 16. Two ids that share those bytes (~1e-6 at millions of lines) make the full sort run
    # instead, so no duplicate is ever missed.
    order = np.argsort(records["d0"], kind="stable")
    firsts_sorted = records["d0"][order]
    same = firsts_sorted[1:] == firsts_sorted[:-1]
    del firsts_sorted
    if not same.any():
        return []
    at = np.flatnonzero(same)
    if not np.array_equal(records["d1"][order[at]], records["d1"][order[at + 1]]):
        order = np.lexsort((records["d1"], records["d0"]))
        d0, d1 = records["d0"][order], records["d1"][order]
        same = (d0[1:] == d0[:-1]) & (d1[1:] == d1[:-1])
        del d0, d1
        if not same.any():
            return []
    first_of_group = np.concatenate(([True], ~same))
    group = np.cumsum(first_of_group, dtype=np.int64) - 1
    lines = records["line"][order]
    firsts = lines[np.flatnonzero(first_of_group)]
    repeats = np.flatnonzero(~first_of_group)
    return list(zip(lines[repeats].tolist(), firsts[group[repeats]].tolist(), strict=True))
