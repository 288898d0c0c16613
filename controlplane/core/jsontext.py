"""Checks on JSON from users that Python's json module does not make: nesting depth, and text that
cannot be stored (lone surrogates, NUL). Shared by the API's body parser and the batch line reader."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

# Deepest nesting of arrays and objects a JSON body or input line may have. Requests need ~40 at most (a
# tensor of numpy's 32 dimensions in its envelope). A fixed bound gives the same verdict everywhere;
# Python's recursion limit would depend on how deep the caller's stack already is.
MAX_JSON_DEPTH = 64
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')


def reject_constant(name: str) -> Any:
    """``parse_constant`` for json.loads: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON; send numbers only")


def json_error_text(exc: ValueError) -> str:
    """What json.loads refused, in at most 200 characters and without Python's advice to the programmer."""
    text = str(exc)
    if "integer string conversion" in text:  # CPython's limit on int("1" * 5000)
        return "a number has more than 4300 digits"
    return text[:200]


def too_deep(raw: bytes) -> bool:
    """Whether ``raw`` nests arrays/objects deeper than MAX_JSON_DEPTH (brackets in strings do not count).
    Counting is cheap; the exact depth is taken (at numpy speed) only when there are enough brackets."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    codes = np.frombuffer(_JSON_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = ((codes == ord("[")) | (codes == ord("{"))).astype(np.int32)
    steps -= (codes == ord("]")) | (codes == ord("}"))
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0)) > MAX_JSON_DEPTH


def _text_fault(text: str, *, reject_nul: bool) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "a lone UTF-16 surrogate"
    if reject_nul and "\x00" in text:
        return "a NUL character"
    return None


def bad_text(obj: Any, *, reject_nul: bool) -> tuple[str, str] | None:
    """The first string (or key) in a decoded JSON value that cannot be stored as text: ``(path, what)``
    with a parameter path such as ``body.input[3]`` (``""`` is the value itself; a bad key names its
    object), or None. Iterative, so a long list or deep nesting costs no recursion."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            fault = _text_fault(value, reject_nul=reject_nul)
            if fault is not None:
                return path, fault
        elif isinstance(value, Mapping):
            for key, item in reversed(list(value.items())):
                fault = _text_fault(key, reject_nul=reject_nul) if isinstance(key, str) else None
                if fault is not None:
                    return path, fault
                stack.append((f"{path}.{key}" if path else str(key), item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None
