"""The part file format (controlplane/batches/run/parts.py): entries written by the shard worker, read back by
finalization entry by entry and by the live results stream in bulk."""

from __future__ import annotations

import pytest

from controlplane.batches.run.parts import decode_entry, encode_entry, part_payloads
from controlplane.batches.run.records import error_record, output_record


def _part() -> bytes:
    entries = []
    for line in range(1, 40):
        if line % 4 == 0:
            record = error_record("batch_1", line, f"r{line}", code="bad", message="line 7 out of 9\\n")
            entries.append(encode_entry(line, "err", record))
        else:
            body = {"object": "list", "data": [{"embedding": [0.5, -1.25], "text": " 3 out {}"}]}
            entries.append(encode_entry(line, "out", output_record("batch_1", line, f"r{line}", body)))
        if line % 9 == 0:
            entries.append(b"\n")  # a blank line, which readers skip
    return b"".join(entries)


def _decoded(part: bytes, kind: str) -> list[bytes]:
    entries = [decode_entry(raw) for raw in part.splitlines(keepends=True) if raw.strip()]
    return [payload for _, entry_kind, payload in entries if entry_kind == kind]


@pytest.mark.parametrize(("kind", "count"), [("out", 30), ("err", 9)])
def test_bulk_payloads_are_the_decoded_entries_of_that_kind(kind, count):
    part = _part()
    assert len(_decoded(part, kind)) == count
    assert part_payloads(part, kind) == _decoded(part, kind)
    # A last line cut short (no newline) ends with one, as decode_entry gives it.
    cut = part.rstrip(b"\n")
    assert part_payloads(cut, kind) == _decoded(cut, kind)
    assert part_payloads(cut, "out")[-1].endswith(b"}\n")


def test_bulk_payloads_of_nothing_are_empty():
    assert part_payloads(b"", "out") == []
