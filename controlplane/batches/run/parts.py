"""The part file format: one line per finished request, ``<line number> <out|err> <record JSON>``.

The record is encoded once, by the worker that ran it (orjson, numpy arrays included); finalization only
reads the prefix and copies the JSON bytes into the output or error file, in input order."""

from __future__ import annotations

import re
from typing import Any

import orjson

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
# An entry is one line: orjson never writes a raw newline inside a record.
_PAYLOADS = {kind: re.compile(rb"^\d+ " + kind.encode() + rb" (.*\n)", re.MULTILINE) for kind in ("out", "err")}


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=_OPTIONS)


def encode_entry(line: int, kind: str, record: dict[str, Any]) -> bytes:
    return b"%d %s %s\n" % (line, kind.encode(), dumps(record))


def decode_entry(raw: bytes) -> tuple[int, str, bytes]:
    """(line number, "out" | "err", record JSON with its newline)."""
    number, kind, payload = raw.split(b" ", 2)
    return int(number), kind.decode(), payload if payload.endswith(b"\n") else payload + b"\n"


def part_payloads(text: bytes, kind: str) -> list[bytes]:
    """The record JSON, with its newline, of each ``kind`` entry in ``text`` (whole lines of a part), in
    order: ``decode_entry``'s payloads of that kind, found in one pass of the regex engine instead of a Python
    step per line (results/live.py streams a closed shard's part this way)."""
    if text and not text.endswith(b"\n"):
        text += b"\n"  # a last line cut short: decode_entry ends its payload with a newline too
    return _PAYLOADS[kind].findall(text)
