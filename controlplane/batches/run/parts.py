"""The part file format: one line per finished request, ``<line number> <out|err> <record JSON>``.

The record is encoded once, by the worker that ran it (orjson, numpy arrays included); finalization only
reads the prefix and copies the JSON bytes into the output or error file, in input order."""

from __future__ import annotations

from typing import Any

import orjson

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


def dumps(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=_OPTIONS)


def encode_entry(line: int, kind: str, record: dict[str, Any]) -> bytes:
    return b"%d %s %s\n" % (line, kind.encode(), dumps(record))


def decode_entry(raw: bytes) -> tuple[int, str, bytes]:
    """(line number, "out" | "err", record JSON with its newline)."""
    number, kind, payload = raw.split(b" ", 2)
    return int(number), kind.decode(), payload if payload.endswith(b"\n") else payload + b"\n"
