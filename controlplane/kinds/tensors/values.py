"""A tensor's values: KServe datatypes, the checked cast of one input's JSON list (every value made to fit
its type, or a BodyIssue), and the unchecked cast of many lines' lists at once (packing, columns)."""

from __future__ import annotations

from typing import Any

import numpy as np

from controlplane.core.http.errors import quote
from controlplane.kinds.base import BodyIssue

KSERVE_DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


NUMPY_TO_KSERVE = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}


def tensor_array(data: Any, datatype: str, param: str) -> np.ndarray:
    """The values of one input as an array of its KServe type, every value checked to fit: numpy would
    otherwise wrap 1000 into an INT8, truncate 1.5, turn 1e39 into an FP32 inf or "1" into 1.0."""
    if not isinstance(data, list):
        raise BodyIssue("invalid_data", f"{param} must be a list of {datatype} values, got {quote(data)}.", param)
    try:
        # Numbers are inferred first (bool, int64/uint64, float64; str or object means a wrong value).
        array = np.asarray(data, dtype=np.object_) if datatype == "BYTES" else np.asarray(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BodyIssue("invalid_data", f"{param} does not hold {datatype} values: {str(exc)[:200]}.", param) from exc
    if datatype == "BYTES":
        bad = next((v for v in array.flat if not isinstance(v, str)), None)
        if bad is not None:
            raise BodyIssue("invalid_data", f"{param} must hold strings for BYTES, got {quote(bad)}.", param)
        return array
    if array.dtype.kind not in "biuf":
        raise BodyIssue("invalid_data", f"{param} must hold only numbers (within range) for {datatype}.", param)
    target = np.dtype(KSERVE_DTYPES[datatype])
    array = exact_integers(data, array, target)
    if array.size:
        bad_value, want = _first_out_of_range(array, target)
        if bad_value is not None:
            raise BodyIssue(
                "invalid_data", f"{param} value {quote(bad_value)} is out of range: {datatype} takes {want}.", param
            )
    return array.astype(target)


# Integers beyond ±2**53 lose digits as float64, the type numpy infers for ints beside a float.
_FLOAT_EXACT = 2**53


def exact_integers(data: list[Any], inferred: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
    """``inferred`` as it is, unless ``target`` is an integer type, numpy inferred floats (ints beside e.g. 1.0)
    and a big int would be rounded ([2**53 + 1, 1.0] → 2**53, [2**64 - 1, 0.0] → 2**64, out of range): then the
    values as exact Python ints (an object array). Both the checked parse and the fast path cast through this."""
    if inferred.dtype.kind != "f" or target.kind not in "iu":
        return inferred
    values = np.asarray(data, dtype=np.object_)
    if not any(type(v) is int and not -_FLOAT_EXACT <= v <= _FLOAT_EXACT for v in values.flat):
        return inferred
    exact = []
    for value in values.flat:
        if type(value) is float and not value.is_integer():
            return inferred  # not a whole number: the float checks refuse it
        exact.append(value if type(value) is int else int(value))
    return np.array(exact, dtype=np.object_).reshape(values.shape)


def cast_exactly(data: list[Any], datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A validated numeric input's values as an array of its KServe type: inferred, then cast, exactly as
    ``tensor_array`` does (no checks: validation made them)."""
    target = np.dtype(KSERVE_DTYPES[datatype])
    return exact_integers(data, np.asarray(data), target).astype(target).reshape(shape)


def _first_out_of_range(array: np.ndarray, target: np.dtype[Any]) -> tuple[Any, str]:
    """A value of ``array`` that ``target`` cannot hold exactly (None if all fit), and what it takes."""
    if target.kind == "b":
        valid = np.isin(array, (0, 1))
        want = "true/false (or 0/1)"
    elif target.kind in "iu":
        info = np.iinfo(target)
        want = f"integers in {info.min}..{info.max}"
        if array.dtype.kind != "f":
            # Exact integers: compare as Python ints (as floats, 2**63 - 1 would round up and pass).
            low, high = int(array.min()), int(array.max())
            return (low if low < info.min else high if high > info.max else None), want
        # Floats: a whole number in range is accepted; the bound is a power of two, exact as a float.
        valid = (array >= info.min) & (array < float(info.max) + 1) & (np.floor(array) == array)
    else:
        limit = float(np.finfo(target).max)
        valid = np.abs(array.astype(np.float64)) <= limit  # False for NaN and inf (from 1e400) too
        want = f"finite numbers within ±{limit:.4g}"
    if valid.all():
        return None, want
    return array.flat[int(np.argmin(valid))].item(), want


# The type numpy infers for a list of only these (what the checked parse casts from, line by line).
_INFERRED = {float: np.float64, int: np.int64, bool: np.bool_}


def stack_values(flat: list[Any], datatype: str, shape: tuple[int, ...]) -> np.ndarray | None:
    """Many lines' values of one input as one array of ``shape``, equal to casting each line's own list
    (what the checked parse does) when every value has one Python type; None otherwise (mixed types, an
    integer past int64), and the caller casts line by line."""
    kinds = set(map(type, flat))
    inferred = _INFERRED.get(kinds.pop()) if len(kinds) == 1 else (np.float64 if not kinds else None)
    if inferred is None:
        return None
    try:
        array = np.array(flat, dtype=inferred)
    except OverflowError:
        return None
    return array.astype(KSERVE_DTYPES[datatype]).reshape(shape)
