"""Validation's fast lane: a well-formed line is accepted without the general checks' cost.

Validation reads every line of every batch, so its per-line cost bounds how soon a batch starts. The checked
parse (batches/requests.py: ``parse_line``) is written to explain every way a line can be wrong; the hot-path
profile (docs/PERFORMANCE.md) had it at ~14 µs per identity line, most of it numpy calls on four-value arrays.
This lane checks the same rules on the common shapes in plain Python over orjson's parse and returns only what
validation keeps of a line (its custom_id, model and work units). It never decides a line is wrong: whenever a
line is unusual (a BOM, an escaped surrogate, nested data, a BOOL tensor, a float in an integer tensor, an
integer past 64 bits, anything orjson refuses) it answers None and the caller runs the checked parse, which
accepts or writes the line's error. A property test (tests/batches/test_quickcheck.py) holds it to that:
on generated good and broken lines, its answer is None or exactly the checked parse's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import orjson

from controlplane.batches.models import Endpoint
from controlplane.batches.requests import KSERVE_DTYPES, MAX_EMBEDDING_INPUTS
from controlplane.core.jsontext import MAX_JSON_DEPTH
from controlplane.fleet.models import CatalogueModel, ModelKind

# The checked parse looks for lone surrogates only where the line escapes one; so does this lane (and leaves).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
# orjson reads an integer literal past 64 bits as a float, where the checked parse keeps it exact (and refuses
# it in a tensor): a float value this large leaves for the checked parse (a float literal that large, rare,
# only takes the slower path).
_FLOAT_FROM_BIG_INT = float(2**64)
_INT64 = (-(2**63), 2**63 - 1)


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
        self.dimensions = model.embedding_dimensions
        self.max_batch_size = model.max_batch_size
        self.specs = {spec["name"]: spec for spec in model.inputs}
        self.known_outputs = frozenset(spec["name"] for spec in model.outputs)
        text = endpoint == Endpoint.EMBEDDINGS
        # A model of the other kind than the endpoint's is never accepted here (the checked parse says why).
        self.units: Callable[[dict[str, Any]], int | None] | None = None
        self.body: dict[str, Any] = {}
        if text and model.kind == ModelKind.EMBEDDINGS:
            self.units = self._embedding_units
        elif not text and model.kind == ModelKind.TENSOR:
            self.units = self._tensor_rows

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
        self.body = body  # the accepted line's body, for validation's shard columns (batches/columns.py)
        return LineFacts(custom_id, self.model_name, units)

    def _embedding_units(self, body: dict[str, Any]) -> int | None:
        given = body.get("input")
        texts = [given] if type(given) is str else given
        if type(texts) is not list or not 0 < len(texts) <= MAX_EMBEDDING_INPUTS:
            return None
        units = 0
        for text in texts:
            if type(text) is not str or not text:
                return None
            units += len(text) // 4 + 2  # requests.work_units
        if body.get("encoding_format", "float") not in ("float", "base64"):
            return None
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != self.dimensions:
            return None
        return units

    def _tensor_rows(self, body: dict[str, Any]) -> int | None:
        items = body.get("inputs")
        specs = self.specs
        if type(items) is not list or len(items) != len(specs):
            return None
        if len(items) == 1:  # the common case: one input, no bookkeeping of names seen
            item = items[0]
            if type(item) is not dict:
                return None
            name = item.get("name")
            if type(name) is not str or name not in specs:
                return None
            only = _input_rows(item, specs[name], self.max_batch_size)
            return None if only is None else self._outputs_ok(body, only)
        rows: int | None = None
        seen: set[str] = set()
        for item in items:
            if type(item) is not dict:
                return None
            name = item.get("name")
            if type(name) is not str or name not in specs or name in seen:
                return None
            seen.add(name)
            count = _input_rows(item, specs[name], self.max_batch_size)
            if count is None or (rows is not None and count != rows):
                return None
            rows = count
        return None if rows is None else self._outputs_ok(body, rows)

    def _outputs_ok(self, body: dict[str, Any], rows: int) -> int | None:
        outputs = body.get("outputs")
        if outputs is not None:
            if type(outputs) is not list or not outputs or any(type(o) is not dict for o in outputs):
                return None
            if any(str(o.get("name")) not in self.known_outputs for o in outputs):
                return None
        return rows


def _input_rows(item: dict[str, Any], spec: dict[str, Any], max_batch_size: int) -> int | None:
    """The input's rows when its datatype, shape and flat data pass the checked parse's rules."""
    datatype = item.get("datatype")
    shape = item.get("shape")
    data = item.get("data")
    dims = spec["dims"]
    if datatype != spec["datatype"] or type(shape) is not list or type(data) is not list:
        return None
    if len(shape) != len(dims) + 1:
        return None
    for d in shape:
        if type(d) is not int or d < 0:
            return None
    if not 1 <= shape[0] <= max_batch_size:
        return None
    for got, want in zip(shape[1:], dims, strict=True):
        if want != -1 and got != want:
            return None
    if len(data) != math.prod(shape) or not data or not _values_fit(data, datatype):
        return None
    return int(shape[0])


def _limits(datatype: str) -> tuple[str, float, float]:
    """(kind, lowest, highest) of the values the checked parse takes for ``datatype`` (requests._tensor_array)."""
    target = np.dtype(KSERVE_DTYPES[datatype])
    if target.kind == "f":
        limit = float(np.finfo(target).max)
        return "f", -limit, limit
    if target.kind in "iu":
        info = np.iinfo(target)
        return "i", int(info.min), int(info.max)
    return target.kind, 0, 0


_ONLY_FLOATS = {float}

# Looked up once: np.finfo/np.iinfo per line were a tenth of the lane's time.
_LIMITS = {datatype: _limits(datatype) for datatype in KSERVE_DTYPES if datatype != "BYTES"}


def _values_fit(data: list[Any], datatype: str) -> bool:
    """Every value a plain scalar the checked parse would take for ``datatype`` (requests._tensor_array)."""
    if datatype == "BYTES":
        return all(type(v) is str for v in data)
    kind, low, high = _LIMITS[datatype]
    if kind == "f":
        if set(map(type, data)) == _ONLY_FLOATS:  # the common case, without a Python loop over the values
            lowest, highest = min(data), max(data)
            return lowest > -_FLOAT_FROM_BIG_INT and highest < _FLOAT_FROM_BIG_INT and low <= lowest and highest <= high
        # An int is exact here and within ±limit in float64 too (the limits are far below 2**63 rounding).
        for v in data:
            t = type(v)
            if (
                not (
                    (t is float and -_FLOAT_FROM_BIG_INT < v < _FLOAT_FROM_BIG_INT)
                    or (t is int and _INT64[0] <= v <= _INT64[1])
                )
                or not low <= v <= high
            ):
                return False
        return True
    if kind == "i":
        # Past int64 (UINT64 only), numpy infers uint64 or, beside smaller values, float64, which rounds:
        # the checked parse decides those (hypothesis found [0, 2**64 - 1024] accepted here, refused there).
        return all(type(v) is int and low <= v <= high for v in data) and (high <= _INT64[1] or max(data) <= _INT64[1])
    return False  # BOOL: the checked parse's 0/1 rules
