"""Shard columns: a tensor shard's lines as validation read them, so that the shard does not parse JSON again.

Validation (batches/intake/validation.py) reads every line of a file; its fast lane (batches/intake/quickcheck.py) has each
accepted line's body in hand. For a tensor model it keeps, per planned shard, the lines' numbers, custom_ids,
rows and every input's values, and writes them next to the shard's parts as one small binary blob when the
shard closes (before the shard row exists, so a worker never looks for columns not yet written). The shard's
run then loads arrays instead of parsing its lines: on the hot-path benchmark parsing and packing a 4,096-line
shard took ~20 ms of the shard worker's CPU, loading its columns ~1 ms (docs/performance.md).

Columns are an optimisation, never a source of truth the run depends on:
- a shard gets columns only when every one of its lines went through the fast lane, named no outputs, had
  the same non-batch dims, and every value of each input had one Python type; the arrays are then cast
  exactly as packing._stack_raw casts a call (``values.stack_values``), which property tests hold equal to
  the checked parse, line by line. Anything else leaves the shard without columns (``Shard.columns_name``
  blank) and it parses its lines as before;
- a worker that cannot use a shard's columns (missing, unreadable, not matching the shard or the pinned
  model) logs it and parses the lines;
- the blob is named by the validation attempt (``parts/<batch>/<index>.columns<attempt>.bin``), deleted with
  the shard's parts (batches/results/retention.parts_collect, early_dispatch.shards_discard), and when validation fails.

Format: ``MAGIC``, a JSON header line (line count, total rows, custom_ids byte length, each input's name,
numpy dtype and shape), then the raw bytes of: line numbers (int64), rows per line (int32), the custom_ids
as one JSON array, and each input's array in header order."""

from __future__ import annotations

import io
import logging
from typing import Any, NamedTuple

import numpy as np
import orjson

from controlplane.files.storage import blob_open
from controlplane.fleet.models import CatalogueModel, ModelKind
from controlplane.kinds.base import Call, Member, ParsedLine
from controlplane.kinds.tensors.values import KSERVE_DTYPES, stack_values

logger = logging.getLogger(__name__)

MAGIC = b"CPCOLS1\n"


class ColumnsUnusable(ValueError):
    """The blob is not columns this shard can run from; the caller parses the lines instead."""


class ShardColumns(NamedTuple):
    numbers: list[int]
    custom_ids: list[str]
    rows: list[int]
    inputs: dict[str, np.ndarray]  # stacked along the batch dimension, in the model's input order

    def calls(self, max_batch_size: int, output_names: list[str]) -> list[Call]:
        """Consecutive lines up to ``max_batch_size`` rows per call: the calls packing.pack_tensors makes of
        the same lines (one signature, line order)."""
        calls: list[Call] = []
        members: list[Member] = []
        first_row = rows_in_call = 0
        for number, rows in zip(self.numbers, self.rows, strict=True):
            if members and rows_in_call + rows > max_batch_size:
                calls.append(self._call(first_row, rows_in_call, members, output_names))
                first_row, rows_in_call, members = first_row + rows_in_call, 0, []
            members.append(Member(number, 0, rows_in_call, rows))
            rows_in_call += rows
        if members:
            calls.append(self._call(first_row, rows_in_call, members, output_names))
        return calls

    def _call(self, first: int, rows: int, members: list[Member], output_names: list[str]) -> Call:
        return Call({name: a[first : first + rows] for name, a in self.inputs.items()}, list(output_names), members)


def columns_encode(columns: ShardColumns) -> bytes:
    custom_ids = orjson.dumps(columns.custom_ids)
    header = {
        "lines": len(columns.numbers),
        "rows": int(sum(columns.rows)),
        "custom_ids_bytes": len(custom_ids),
        "inputs": [[name, a.dtype.str, list(a.shape)] for name, a in columns.inputs.items()],
    }
    out = io.BytesIO()
    out.write(MAGIC)
    out.write(orjson.dumps(header) + b"\n")
    out.write(np.asarray(columns.numbers, dtype="<i8").tobytes())
    out.write(np.asarray(columns.rows, dtype="<i4").tobytes())
    out.write(custom_ids)
    for array in columns.inputs.values():
        out.write(np.ascontiguousarray(array).tobytes())
    return out.getvalue()


def columns_decode(data: bytes) -> ShardColumns:
    """Raises ColumnsUnusable on anything but a whole, consistent blob."""
    try:
        if not data.startswith(MAGIC):
            raise ColumnsUnusable("not a columns blob")
        end = data.index(b"\n", len(MAGIC))
        header = orjson.loads(data[len(MAGIC) : end])
        lines, total_rows, id_bytes = int(header["lines"]), int(header["rows"]), int(header["custom_ids_bytes"])
        at = end + 1
        numbers = np.frombuffer(data, dtype="<i8", count=lines, offset=at).tolist()
        at += 8 * lines
        rows = np.frombuffer(data, dtype="<i4", count=lines, offset=at).tolist()
        at += 4 * lines
        custom_ids = orjson.loads(data[at : at + id_bytes])
        at += id_bytes
        inputs = {}
        for name, dtype, shape in header["inputs"]:
            kind = np.dtype(dtype)
            if kind.hasobject or not shape or shape[0] != total_rows:
                raise ColumnsUnusable(f"input {name!r} has an unexpected type or shape")
            count = int(np.prod(shape))
            inputs[str(name)] = np.frombuffer(data, dtype=kind, count=count, offset=at).reshape(shape)
            at += count * kind.itemsize
    except ColumnsUnusable:
        raise
    except (ValueError, KeyError, TypeError, IndexError) as exc:  # truncated, garbled, a bad header
        raise ColumnsUnusable(f"unreadable columns blob: {exc}") from exc
    if at != len(data) or len(custom_ids) != lines or sum(rows) != total_rows:
        raise ColumnsUnusable("columns blob is inconsistent")
    return ShardColumns(numbers, custom_ids, rows, inputs)


def columns_name(batch_id: str, index: int, attempt: int) -> str:
    return f"parts/{batch_id}/{index:06d}.columns{attempt}.bin"


class ColumnCollector:
    """Validation's side: fed each accepted line of the open shard, it writes the shard's columns when the
    shard closes (``close``), or none if a line made them unusable (``spoil``)."""

    def __init__(self, model: CatalogueModel, *, batch_id: str, attempt: int, save: Any) -> None:
        self.names = tuple(spec["name"] for spec in model.inputs)
        self.datatypes = tuple(spec["datatype"] for spec in model.inputs)
        # Non-batch dims the model fixes are the same on every accepted line; a -1 dim is compared per line.
        self._variable = any(-1 in spec["dims"] for spec in model.inputs)
        self._fixed_dims = tuple(tuple(spec["dims"]) for spec in model.inputs)
        self.batch_id, self.attempt, self._save = batch_id, attempt, save
        self.written: list[str] = []
        self._reset()

    @staticmethod
    def suits(model: CatalogueModel) -> bool:
        """Tensor models without BYTES inputs (strings are not stacked from lists: fastparse._with_arrays)."""
        return (
            model.kind == ModelKind.TENSOR
            and bool(model.inputs)
            and all(spec["datatype"] != "BYTES" for spec in model.inputs)
        )

    def _reset(self) -> None:
        self._spoiled = False
        self._numbers: list[int] = []
        self._custom_ids: list[str] = []
        self._rows: list[int] = []
        self._values: list[list[Any]] = [[] for _ in self.names]
        self._dims: tuple[Any, ...] | None = None

    def spoil(self) -> None:
        self._spoiled = True

    def add_parsed(self, number: int, parsed: ParsedLine) -> None:
        # A line only the checked parse took: its values may not stack as the lane's do.
        self._spoiled = True

    def add(self, number: int, custom_id: str, body: dict[str, Any]) -> None:
        """A line the fast lane accepted (its ``body``): shape, datatype and names are the model's."""
        if self._spoiled:
            return
        if "outputs" in body:  # named outputs may differ line by line: the lines are parsed at run time
            self._spoiled = True
            return
        items = body["inputs"]
        if len(items) == 1:
            item = items[0]
            self._values[0].extend(item["data"])
            shapes: Any = item["shape"]
            rows = shapes[0]
            if self._variable:
                shapes = (tuple(shapes[1:]),)
        else:
            given = {item["name"]: item for item in items}
            ordered = [given[name] for name in self.names]
            for values, item in zip(self._values, ordered, strict=True):
                values.extend(item["data"])
            rows = ordered[0]["shape"][0]
            if self._variable:
                shapes = tuple(tuple(item["shape"][1:]) for item in ordered)
        if self._variable:
            if self._dims is None:
                self._dims = shapes
            elif shapes != self._dims:
                self._spoiled = True
                return
        self._numbers.append(number)
        self._custom_ids.append(custom_id)
        self._rows.append(rows)

    def close(self, *, index: int, request_count: int) -> str:
        """End the open shard: its columns' blob name, or "" when it has none."""
        try:
            if self._spoiled or len(self._numbers) != request_count:
                return ""
            total = sum(self._rows)
            dims = self._dims if self._dims is not None else self._fixed_dims
            inputs = {}
            for i, name in enumerate(self.names):
                try:
                    array = stack_values(self._values[i], self.datatypes[i], (total, *dims[i]))
                except ValueError:  # values that do not fill the shape: the lane would not have let them by
                    array = None
                if array is None:
                    return ""
                inputs[name] = array
            name = columns_name(self.batch_id, index, self.attempt)
            self._save(
                name, io.BytesIO(columns_encode(ShardColumns(self._numbers, self._custom_ids, self._rows, inputs)))
            )
            self.written.append(name)
            return name
        finally:
            self._reset()


def columns_load(
    *, name: str, first_line: int, last_line: int, request_count: int, model: CatalogueModel
) -> ShardColumns | None:
    """A shard's columns (blob ``name``, lines ``first_line``..``last_line``) when they are usable for ``model``
    (the batch's pinned entry), else None (logged): the caller parses the shard's lines instead."""
    if not name:
        return None
    try:
        with blob_open(name) as stream:
            columns = columns_decode(stream.read())
        _check(columns, first_line, last_line, request_count, model)
    except (OSError, ColumnsUnusable) as exc:
        logger.warning("columns %s not used (%s); parsing its lines", name, exc)
        return None
    return columns


def _check(columns: ShardColumns, first_line: int, last_line: int, request_count: int, model: CatalogueModel) -> None:
    numbers = columns.numbers
    if len(numbers) != request_count or not numbers:
        raise ColumnsUnusable(f"{len(numbers)} lines for a shard of {request_count}")
    if numbers[0] < first_line or numbers[-1] > last_line:
        raise ColumnsUnusable("lines outside the shard's range")
    if list(columns.inputs) != [spec["name"] for spec in model.inputs]:
        raise ColumnsUnusable("inputs are not the model's")
    for spec, array in zip(model.inputs, columns.inputs.values(), strict=True):
        dims = spec["dims"]
        if array.dtype != np.dtype(KSERVE_DTYPES[spec["datatype"]]) or len(array.shape) != len(dims) + 1:
            raise ColumnsUnusable(f"input {spec['name']!r} is not the model's datatype or rank")
        if any(want not in (-1, got) for want, got in zip(dims, array.shape[1:], strict=True)):
            raise ColumnsUnusable(f"input {spec['name']!r} does not have the model's dims")
