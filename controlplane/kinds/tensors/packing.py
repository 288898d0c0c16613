"""Packing a shard's tensor lines into Triton calls, and cutting a call's outputs back into lines' bodies.

Lines whose inputs share names, datatypes and non-batch dims are stacked along the batch dimension, up to
the model's max_batch_size rows per call. Lines the fast parse kept as JSON lists (RawTensorRequest) are cast
once per call rather than once per line."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from controlplane.kinds.base import Call, Member, ParsedLine
from controlplane.kinds.tensors.requests import RawTensorRequest, TensorRequest
from controlplane.kinds.tensors.values import NUMPY_TO_KSERVE, stack_values


def pack_tensors(lines: dict[int, ParsedLine], max_batch_size: int) -> list[Call]:
    """Lines whose inputs share names, types and non-batch dims are stacked along the batch dim."""
    groups: dict[Any, list[tuple[int, TensorRequest | RawTensorRequest]]] = defaultdict(list)
    for number, parsed in lines.items():
        request = parsed.request
        assert isinstance(request, (TensorRequest, RawTensorRequest))
        groups[request.signature()].append((number, request))
    calls: list[Call] = []
    for signature in sorted(groups, key=repr):
        pending: list[tuple[int, TensorRequest | RawTensorRequest]] = []
        rows = 0  # of pending, kept as it grows (summing pending per line was quadratic in the call size)
        for number, request in groups[signature]:
            if pending and rows + request.rows > max_batch_size:
                calls.append(_stack(pending))
                pending, rows = [], 0
            pending.append((number, request))
            rows += request.rows
        if pending:
            calls.append(_stack(pending))
    return calls


def _stack(pending: list[tuple[int, TensorRequest | RawTensorRequest]]) -> Call:
    first = pending[0][1]
    inputs = _stack_raw(pending) if all(type(r) is RawTensorRequest for _, r in pending) else None
    if inputs is None:
        per_line = [_line_arrays(request) for _, request in pending]
        names = first.names if isinstance(first, RawTensorRequest) else tuple(i.name for i in first.inputs)
        inputs = {name: np.concatenate([arrays[i] for arrays in per_line], axis=0) for i, name in enumerate(names)}
    members, start = [], 0
    for number, request in pending:
        members.append(Member(number, 0, start, request.rows))
        start += request.rows
    return Call(inputs, list(first.output_names), members)


def _line_arrays(request: TensorRequest | RawTensorRequest) -> tuple[np.ndarray, ...]:
    return request.arrays() if isinstance(request, RawTensorRequest) else tuple(i.array for i in request.inputs)


def _stack_raw(pending: list[tuple[int, Any]]) -> dict[str, np.ndarray] | None:
    """One array per input for the whole call, straight from the lines' lists. Equal to stacking the
    lines' own arrays whenever every value of an input has one Python type (numpy infers float64, int64 or
    bool for each line then, and for the whole list alike); otherwise (mixed types, nested lists, an
    integer past int64) None, and the caller casts line by line as the checked parse does."""
    first: RawTensorRequest = pending[0][1]
    rows = sum(request.rows for _, request in pending)
    inputs = {}
    for i, name in enumerate(first.names):
        flat = list(chain.from_iterable(request.values[i] for _, request in pending))
        array = stack_values(flat, first.datatypes[i], (rows, *first.shapes[i][1:]))
        if array is None:
            return None
        inputs[name] = array
    return inputs


@dataclass(frozen=True, slots=True)
class CallRows:
    """A call's outputs as Python lists, converted once per call: ``(name, datatype, non-batch dims, one flat
    list per row)`` per output. Converting per line instead (a slice, a reshape and a ``tolist()`` for each
    line of a 256-row call) was a quarter of a shard's CPU on one-row lines."""

    outputs: list[tuple[str, str, list[int], list[list[Any]]]]


def call_rows(outputs: dict[str, np.ndarray]) -> CallRows:
    converted = []
    for name, array in outputs.items():
        count = array.shape[0]
        datatype = "BYTES" if array.dtype == np.object_ else NUMPY_TO_KSERVE.get(array.dtype, "FP32")
        if not array.size:
            rows: list[list[Any]] = [[] for _ in range(count)]
        elif datatype == "BYTES":
            rows = [
                [v.decode(errors="replace") if isinstance(v, bytes) else v for v in row]
                for row in array.reshape(count, -1)
            ]
        else:
            rows = array.reshape(count, -1).tolist()
        converted.append((name, datatype, list(array.shape[1:]), rows))
    return CallRows(converted)


def tensor_body(model_name: str, call: CallRows, member: Member) -> dict[str, Any]:
    """A KServe v2 inference response for one line: its rows of the call's outputs."""
    outputs = []
    for name, datatype, dims, rows in call.outputs:
        if member.rows == 1:
            data = rows[member.start]
        else:
            data = [v for row in rows[member.start : member.start + member.rows] for v in row]
        outputs.append({"name": name, "datatype": datatype, "shape": [member.rows, *dims], "data": data})
    return {"model_name": model_name, "model_version": "1", "outputs": outputs}
