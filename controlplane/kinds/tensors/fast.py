"""Parsing a line that validation already accepted, without checking it again.

Validation (batches/intake/validation.py) reads every line once with every check (kinds/tensors/requests.py), against
the catalogue entry the batch pins (batches/pinning.py); the input file cannot change after upload. A
shard therefore re-reads only what it needs to build Triton calls: orjson instead of json, none of the
range checks, and numeric inputs kept as the JSON's lists (a RawTensorRequest) so that packing casts one
array per call rather than one per line (packing._stack_raw). The hot-path profile (docs/performance.md)
had the checked parse at ~37 % of a worker's busy time on identity lines, then the per-line arrays of
this parse at ~18 %.

Anything unexpected (a BOM on the line, a field missing) returns None and the caller falls back to the
checked parse, so this path can only be faster, never different: property tests compare the two, line by
line and stacked into calls, on generated lines of every datatype.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import ParsedLine
from controlplane.kinds.tensors.requests import RawTensorRequest, Signature, TensorInput, TensorRequest
from controlplane.kinds.tensors.values import cast_exactly

_DIMS = itemgetter(slice(1, None))  # a shape's non-batch dims


class ValidatedTensorLines:
    """Parses one batch's validated tensor lines against its pinned model; what is the same for every line
    (the input names in the model's order, the default outputs, each signature) is worked out once."""

    def __init__(self, model: CatalogueModel) -> None:
        self.names = tuple(spec["name"] for spec in model.inputs)
        self.default_outputs = tuple(spec["name"] for spec in model.outputs)
        self._keys: dict[tuple[Any, ...], Signature] = {}

    def parse(self, raw: bytes) -> ParsedLine | None:
        try:
            obj = orjson.loads(raw)
            body = obj["body"]
            inputs = body["inputs"]
            if len(inputs) == 1 == len(self.names) and inputs[0]["name"] == self.names[0]:
                items = inputs
            else:
                given = {item["name"]: item for item in inputs}
                items = [given[name] for name in self.names]
            datatypes, shapes, values = [], [], []
            for item in items:
                datatypes.append(item["datatype"])
                shapes.append(tuple(item["shape"]))
                values.append(item["data"])
            outputs: Any = body.get("outputs")
            output_names = self.default_outputs if outputs is None else tuple(str(o.get("name")) for o in outputs)
            if "BYTES" in datatypes:
                request: RawTensorRequest | TensorRequest = _with_arrays(
                    self.names, datatypes, shapes, values, output_names
                )
            else:
                request = RawTensorRequest(
                    self._key(datatypes, shapes, output_names),
                    shapes[0][0],
                    self.names,
                    tuple(datatypes),
                    tuple(shapes),
                    tuple(values),
                    output_names,
                )
            return ParsedLine(obj["custom_id"], body["model"], request)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, OverflowError, AttributeError, IndexError):
            return None

    def _key(self, datatypes: list[str], shapes: list[tuple[int, ...]], output_names: tuple[str, ...]) -> Signature:
        lookup = (*datatypes, *map(_DIMS, shapes), output_names)
        key = self._keys.get(lookup)
        if key is None:
            key = (
                *((name, dt, shape[1:]) for name, dt, shape in zip(self.names, datatypes, shapes, strict=True)),
                ("outputs", ",".join(output_names), ()),
            )
            self._keys[lookup] = key
        return key


def _with_arrays(
    names: tuple[str, ...],
    datatypes: list[str],
    shapes: list[tuple[int, ...]],
    values: list[Any],
    output_names: tuple[str, ...],
) -> TensorRequest:
    """Lines with a BYTES input keep one array per line (strings are not stacked from lists)."""
    inputs = []
    for name, datatype, shape, data in zip(names, datatypes, shapes, values, strict=True):
        if datatype == "BYTES":
            array = np.asarray(data, dtype=np.object_).reshape(shape)
        else:  # cast as the checked parse casts (big integers beside floats kept exact)
            array = cast_exactly(data, datatype, shape)
        inputs.append(TensorInput(name=name, datatype=datatype, shape=shape, array=array))
    return TensorRequest(inputs=tuple(inputs), output_names=output_names)
