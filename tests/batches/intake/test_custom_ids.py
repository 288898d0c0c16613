"""Duplicate custom_ids in packed form (batches/intake/custom_ids.py) against a plain dict, across the bitmap's
doublings (it starts at 2**17 bits and doubles every 8,192 lines)."""

from __future__ import annotations

import random

import pytest

from controlplane.batches.intake.custom_ids import CustomIds


def _reference(ids: list[str]) -> list[tuple[int, int, str]]:
    first: dict[str, int] = {}
    found = []
    for line, custom_id in enumerate(ids, start=1):
        if custom_id in first:
            found.append((line, first[custom_id], custom_id))
        else:
            first[custom_id] = line
    return found


def _assert_bitmap_sized(table: CustomIds, lines: int, *, largest: int = 2**27) -> None:
    """The bitmap's promise (custom_ids.py): at least 16 bits a line up to its largest size (2**27 bits, 16 MiB),
    so chance hits stay under ~6 % of lines; and it starts small (2**17 bits), doubling only as the file grows."""
    bits = len(table._seen) * 8
    if table._buffers is not None:  # spilled: it took its largest size then, since it cannot grow after
        assert bits == largest, (lines, bits)
    else:
        assert min(largest, 16 * lines) <= bits <= min(largest, max(2**17, 32 * lines)), (lines, bits)


def test_duplicates_across_the_bitmap_growth_equal_a_plain_dict():
    rng = random.Random(7)
    ids = [f"req-{i}" for i in range(40_000)]
    for line in rng.sample(range(1, len(ids)), 300):  # repeats of earlier ids, before and after each doubling
        ids[line] = ids[rng.randrange(line)]
    table = CustomIds()
    for line, custom_id in enumerate(ids, start=1):
        table.add(custom_id, line)
        _assert_bitmap_sized(table, line)
    assert table.duplicates() == _reference(ids)


def test_no_duplicates_and_a_single_line():
    table = CustomIds()
    for line in range(1, 20_000):
        table.add(str(line), line)
    assert table.duplicates() == []
    one = CustomIds()
    one.add("x", 1)
    assert one.duplicates() == []


def test_ids_sharing_the_first_eight_digest_bytes_still_find_every_duplicate(monkeypatch):
    """The sort is on the first 8 bytes of each digest; two different ids that share them (forced here: the
    digest keeps only 2 bits of entropy up front) must not hide a duplicate that interleaves with them."""
    import hashlib

    from controlplane.batches.intake import custom_ids

    def colliding(data: bytes, digest_size: int) -> hashlib.blake2b:
        real = hashlib.blake2b(data, digest_size=digest_size).digest()

        class Digest:
            def digest(self) -> bytes:
                return bytes(7) + bytes([real[0] & 3]) + real[8:]

        return Digest()  # type: ignore[return-value]

    monkeypatch.setattr(custom_ids, "_blake2b", colliding)
    rng = random.Random(11)
    ids = [f"c-{rng.randrange(50)}" for _ in range(400)]  # many repeats, interleaved, all on 4 first halves
    table = CustomIds()
    for line, custom_id in enumerate(ids, start=1):
        table.add(custom_id, line)
    assert table.duplicates() == _reference(ids)


@pytest.mark.parametrize("spill_at", [1_000, 9_000])  # before and after the bitmap's first doubling
def test_records_spilled_to_bucket_files_find_the_same_duplicates(monkeypatch, spill_at):
    """Past SPILL_AT lines the records go to per-bucket temporary files and the duplicates are found one
    bucket at a time: the same answer as a plain dict, including repeats whose first line was in memory."""
    from controlplane.batches.intake import custom_ids

    monkeypatch.setattr(custom_ids, "SPILL_AT", spill_at)
    monkeypatch.setattr(custom_ids, "BUCKET_BUFFER", 400)  # flushes every 20 records
    rng = random.Random(3)
    ids = [f"req-{i}" for i in range(30_000)]
    for line in rng.sample(range(1, len(ids)), 400):
        ids[line] = ids[rng.randrange(line)]
    ids[-1] = ids[0]  # a repeat of the very first line, at the very end
    table = CustomIds()
    for line, custom_id in enumerate(ids, start=1):
        table.add(custom_id, line)
        _assert_bitmap_sized(table, line)
    assert table._buffers is not None  # it did spill
    assert table.duplicates() == _reference(ids)


def test_memory_stays_bounded_past_the_largest_bitmap_and_across_bucket_flushes(monkeypatch):
    """What the module is for (its docstring): little, bounded memory. The bitmap stops doubling at _MAX_BITS
    (shrunk here so a test reaches it), and once spilled each bucket's buffer holds under BUCKET_BUFFER bytes
    plus one record, written out in BUCKET_BUFFER-sized pieces rather than record by record."""
    from controlplane.batches.intake import custom_ids

    monkeypatch.setattr(custom_ids, "_MAX_BITS", 2**18)  # reached after 16,384 lines (16 bits a line)
    monkeypatch.setattr(custom_ids, "SPILL_AT", 20_000)
    monkeypatch.setattr(custom_ids, "BUCKETS", 4)
    # 50.5 records: as the real 256 KiB, not a multiple of the 20-byte record (a flush only at exactly the
    # buffer's size would then never happen).
    monkeypatch.setattr(custom_ids, "BUCKET_BUFFER", 1_010)
    writes: list[int] = []
    original_flush = custom_ids.CustomIds._flush

    def flush(self, index):
        writes.append(len(self._buffers[index]))
        original_flush(self, index)

    monkeypatch.setattr(custom_ids.CustomIds, "_flush", flush)
    rng = random.Random(5)
    ids = [f"req-{i}" for i in range(30_000)]
    for line in rng.sample(range(1, len(ids)), 200):
        ids[line] = ids[rng.randrange(line)]
    table = CustomIds()
    for line, custom_id in enumerate(ids, start=1):
        table.add(custom_id, line)
        _assert_bitmap_sized(table, line, largest=2**18)
        assert (table._buffers is not None) == (line >= 20_000)  # in memory up to SPILL_AT lines
        if table._buffers is not None:
            assert max(len(b) for b in table._buffers) < 1_010 + 20
    assert len(table._seen) * 8 == 2**18
    # Ids kept aside to quote: every repeat, plus a few percent of the other lines by chance (not all of them).
    assert len(table._maybe) < 200 + 0.1 * len(ids)
    spilled = (len(ids) - 20_000) * 20
    assert writes and all(size >= 1_010 for size in writes)  # whole buffers, not single records
    assert len(writes) <= spilled // 1_010
    assert table.duplicates() == _reference(ids)


def test_a_file_of_two_lines_with_one_id():
    table = CustomIds()
    table.add("x", 1)
    table.add("x", 2)
    assert table.duplicates() == [(2, 1, "x")]


def test_two_different_ids_sharing_the_first_eight_bytes_are_no_duplicate(monkeypatch):
    """One pair of distinct ids whose digests share the sorted-on 8 bytes, sorted second and third (an odd
    place): the check of the other 8 bytes must compare each member with its neighbour, or the pair would be
    reported as a duplicate."""
    from controlplane.batches.intake import custom_ids

    digests = {b"first": bytes(16), b"a": bytes(7) + b"\x01" + bytes(8), b"b": bytes(7) + b"\x01" + b"\x01" * 8}

    class Digest:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def digest(self) -> bytes:
            return digests[self.data]

    monkeypatch.setattr(custom_ids, "_blake2b", lambda data, digest_size: Digest(data))
    table = CustomIds()
    for line, custom_id in enumerate(["a", "first", "b"], start=1):
        table.add(custom_id, line)
    assert table._maybe  # the three digests share their low bits: duplicates() cannot answer from the bitmap
    assert table.duplicates() == []
