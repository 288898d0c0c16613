"""Validation's fast lane: a well-formed line is accepted without the general checks' cost.

Validation reads every line of every batch, so its per-line cost bounds how soon a batch starts. The checked
parse (batches/intake/requests.py: ``parse_line``) is written to explain every way a line can be wrong; the hot-path
profile (docs/performance.md) had it at ~14 µs per identity line, most of it numpy calls on four-value arrays.
This lane checks the same rules on the common shapes in plain Python over orjson's parse and returns only what
validation keeps of a line (its custom_id, model and work units). It never decides a line is wrong: whenever a
line is unusual (a BOM, an escaped surrogate, anything orjson refuses, a body the kind's own lane declines:
kinds/base.EndpointKind.quick_units) it answers None and the caller runs the checked parse, which accepts or
writes the line's error. A property test (tests/batches/intake/test_quickcheck.py) holds it to that:
on generated good and broken lines, its answer is None or exactly the checked parse's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

from controlplane.core.jsontext import MAX_JSON_DEPTH
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.registry import kind_for

# The checked parse looks for lone surrogates only where the line escapes one; so does this lane (and leaves).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class LineFacts(NamedTuple):  # one per line of every file: a tuple builds in a third of a frozen dataclass's time
    custom_id: str
    model_name: str
    units: int


def quick_check(raw: bytes, *, endpoint: str, model: CatalogueModel) -> LineFacts | None:
    """The line's facts when the checked parse would accept it for ``model`` (the model validation has
    resolved for this batch), else None: then only the checked parse can tell."""
    return FastLane(endpoint=endpoint, model=model).check(raw)


class FastLane:
    """The lane for one batch: the endpoint and model's rules looked up once, then ``check`` per line."""

    def __init__(self, *, endpoint: str, model: CatalogueModel) -> None:
        self.endpoint = endpoint
        self.model_name = model.name
        kind = kind_for(endpoint)
        # A model of another kind than the endpoint's is never accepted here (the checked parse says why).
        self.units: Callable[[dict[str, Any]], int | None] | None = (
            kind.quick_units(model) if model.kind == kind.model_kind else None
        )
        self.body: dict[str, Any] = {}

    def check(self, raw: bytes) -> LineFacts | None:
        # Fewer brackets than the depth limit: the line cannot nest past it (the checked parse's first test).
        if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH or (b"\\u" in raw and _SURROGATE_ESCAPE.search(raw)):
            return None
        if self.units is None:
            return None
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if type(obj) is not dict:
            return None
        custom_id = obj.get("custom_id")
        body = obj.get("body")
        if (
            type(custom_id) is not str
            or not 0 < len(custom_id) <= 512
            or obj.get("method") != "POST"
            or obj.get("url") != self.endpoint
            or type(body) is not dict
            or body.get("model") != self.model_name
        ):
            return None
        units = self.units(body)
        if units is None:
            return None
        self.body = body  # the accepted line's body, for validation's shard columns (kinds/base.ColumnCollector)
        return LineFacts(custom_id, self.model_name, units)
