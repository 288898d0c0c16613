"""Packing a shard's requests into Triton calls, and assembling results back into response bodies.

The whole shard is known up front, so texts are ordered by length before packing: each call then pads
to a similar length, which on this CPU embeds ~1.6x faster than file order (docs/PERFORMANCE.md)."""

from __future__ import annotations

import base64
import math
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from controlplane.batches.requests import KSERVE_DTYPES, EmbeddingRequest, ParsedLine, RawTensorRequest, TensorRequest

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


class Member(NamedTuple):
    """One piece of one line inside a call: an input text of an embeddings line, or a tensor line's
    rows (``start``..``start+rows`` of the call's batch dimension). One per line of every shard, hence a
    NamedTuple."""

    line: int
    slot: int
    start: int
    rows: int


@dataclass
class Call:
    inputs: dict[str, np.ndarray]
    output_names: list[str]
    members: list[Member] = field(default_factory=list)

    def split(self) -> list[Call]:
        """One call per member: used to find which line a rejected call's error belongs to."""
        return [
            Call(
                {name: array[m.start : m.start + m.rows] for name, array in self.inputs.items()},
                self.output_names,
                [Member(m.line, m.slot, 0, m.rows)],
            )
            for m in self.members
        ]


def members_per_line(calls: list[Call]) -> dict[int, int]:
    counts: dict[int, int] = defaultdict(int)
    for call in calls:
        for member in call.members:
            counts[member.line] += 1
    return counts


# --- embeddings ------------------------------------------------------------------------------------


def pack_embeddings(lines: dict[int, ParsedLine], max_batch_size: int, *, min_calls: int = 1) -> list[Call]:
    """``min_calls``: a small shard is still split into this many calls (the calls kept in flight), so
    every model instance gets a share instead of one instance doing it all while the others idle. Calls
    hold at most ``max_batch_size`` texts and differ in size by one at most."""
    items = [
        (len(text), number, slot, text)
        for number, parsed in lines.items()
        for slot, text in enumerate(_embedding(parsed).texts)
    ]
    items.sort(key=lambda item: (item[0], item[1], item[2]))
    # As few calls as max_batch_size allows (at least min_calls), evened out: 71 texts are 36 + 35, not
    # 64 + a 7-text call that costs an execution of its own (a pass's fixed cost buys 7 texts).
    count = max(1, min_calls, math.ceil(len(items) / max(1, max_batch_size)))
    size = max(1, math.ceil(len(items) / count))
    calls = []
    for begin in range(0, len(items), size):
        chunk = items[begin : begin + size]
        texts = np.array([[text.encode()] for _, _, _, text in chunk], dtype=np.object_)
        members = [Member(number, slot, i, 1) for i, (_, number, slot, _) in enumerate(chunk)]
        calls.append(Call({"TEXT": texts}, ["EMBEDDING", "TOKENS"], members))
    return calls


def embedding_body(parsed: ParsedLine, pieces: dict[int, dict[str, np.ndarray]]) -> tuple[dict[str, Any], int]:
    """OpenAI's embeddings response for one line; returns it with the line's token count."""
    request = _embedding(parsed)
    data = []
    tokens = 0
    for slot in range(len(request.texts)):
        vector = pieces[slot]["EMBEDDING"][0].astype(np.float32)
        tokens += int(pieces[slot]["TOKENS"].reshape(-1)[0])
        if request.encoding_format == "base64":
            embedding: Any = base64.b64encode(vector.astype("<f4").tobytes()).decode()
        else:
            embedding = vector  # encoded straight from numpy by the part writer (orjson)
        data.append({"object": "embedding", "index": slot, "embedding": embedding})
    body = {
        "object": "list",
        "data": data,
        "model": parsed.model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return body, tokens


def _embedding(parsed: ParsedLine) -> EmbeddingRequest:
    assert isinstance(parsed.request, EmbeddingRequest)
    return parsed.request


# --- generic tensors -------------------------------------------------------------------------------


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


# The type numpy infers for a list of only these (what the checked parse casts from, line by line).
_INFERRED = {float: np.float64, int: np.int64, bool: np.bool_}


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


def slice_outputs(outputs: dict[str, np.ndarray], member: Member) -> dict[str, np.ndarray]:
    return {name: array[member.start : member.start + member.rows] for name, array in outputs.items()}
