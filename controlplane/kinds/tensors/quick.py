"""Validation's fast lane for a tensor body (batches/intake/quickcheck.py runs the envelope's part): the rows a
well-formed body asks for, checked by the same rules as the checked parse (kinds/tensors/requests.py) in plain
Python over orjson's parse, or None whenever a body is unusual (nested data, a BOOL tensor, a float in an
integer tensor, an integer past 64 bits): then the checked parse decides. It never refuses a body itself."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.tensors.values import KSERVE_DTYPES

# orjson reads an integer literal past 64 bits as a float, where the checked parse keeps it exact (and refuses
# it in a tensor): a float value this large leaves for the checked parse (a float literal that large, rare,
# only takes the slower path).
_FLOAT_FROM_BIG_INT = float(2**64)
_INT64 = (-(2**63), 2**63 - 1)


class TensorQuickLane:
    """The model's specs looked up once; ``rows`` per line."""

    def __init__(self, model: CatalogueModel) -> None:
        self.max_batch_size = model.max_batch_size
        self.specs = {spec["name"]: spec for spec in model.inputs}
        self.known_outputs = frozenset(spec["name"] for spec in model.outputs)

    def rows(self, body: dict[str, Any]) -> int | None:
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
    """(kind, lowest, highest) of the values the checked parse takes for ``datatype`` (values.tensor_array)."""
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
    """Every value a plain scalar the checked parse would take for ``datatype`` (values.tensor_array)."""
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
