"""A ``/v2/infer`` line's body → its typed request (kinds/tensors/kind.py is the kind): a KServe v2 inference
request, every input checked against the catalogue entry's specs and every value against its datatype."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from controlplane.core.http.errors import quote
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import BodyIssue
from controlplane.kinds.tensors.values import cast_exactly, tensor_array

# (name, datatype, non-batch dims) per input, then ("outputs", names, ()): lines that share one stack.
Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class TensorInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray


@dataclass(frozen=True)
class TensorRequest:
    inputs: tuple[TensorInput, ...]
    output_names: tuple[str, ...]

    @property
    def rows(self) -> int:
        return self.inputs[0].shape[0]

    def signature(self) -> Signature:
        """Requests with equal signatures can be stacked along the batch dimension into one call."""
        return (
            *((i.name, i.datatype, i.shape[1:]) for i in self.inputs),
            ("outputs", ",".join(self.output_names), ()),
        )


class RawTensorRequest(NamedTuple):
    """A validated tensor line's inputs as its JSON gave them (kinds/tensors/fast.py): the values are cast
    when the line's call is stacked (packing.pack_tensors), one array per call instead of one per line.
    ``arrays()`` gives what the checked parse would have built for this line alone."""

    key: Signature  # what signature() answers: computed once, at parse
    rows: int
    names: tuple[str, ...]
    datatypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    values: tuple[list[Any], ...]
    output_names: tuple[str, ...]

    def signature(self) -> Signature:
        return self.key

    def arrays(self) -> tuple[np.ndarray, ...]:
        # Inferred first, then cast, exactly as the checked parse does (values.tensor_array).
        return tuple(
            cast_exactly(values, datatype, shape)
            for values, datatype, shape in zip(self.values, self.datatypes, self.shapes, strict=True)
        )


def tensor_request_parse(body: dict[str, Any], model: CatalogueModel) -> TensorRequest:
    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BodyIssue("invalid_inputs", "body.inputs must be a non-empty list.", "body.inputs")
    specs = {spec["name"]: spec for spec in model.inputs}
    seen: dict[str, TensorInput] = {}
    for i, item in enumerate(raw_inputs):
        param = f"body.inputs[{i}]"
        if not isinstance(item, dict):
            raise BodyIssue("invalid_inputs", f"{param} must be an object.", param)
        name = item.get("name")
        if not isinstance(name, str) or name not in specs:  # a list or object as name is unhashable
            raise BodyIssue(
                "invalid_input_name",
                f"{param}.name {quote(name)} is not an input of {model.name!r}; inputs are {sorted(specs)}.",
                f"{param}.name",
            )
        if name in seen:
            raise BodyIssue("invalid_input_name", f"Input {quote(name)} is given twice.", f"{param}.name")
        seen[name] = _parse_tensor_input(item, specs[name], param, model.max_batch_size)
    missing = sorted(set(specs) - set(seen))
    if missing:
        raise BodyIssue("missing_input", f"Inputs {missing} are required by {model.name!r}.", "body.inputs")
    rows = {t.shape[0] for t in seen.values()}
    if len(rows) != 1:
        raise BodyIssue("invalid_shape", "All inputs must have the same first (batch) dimension.", "body.inputs")
    known_outputs = [spec["name"] for spec in model.outputs]
    raw_outputs = body.get("outputs")
    if raw_outputs is None:
        output_names = tuple(known_outputs)
    elif isinstance(raw_outputs, list) and all(isinstance(o, dict) for o in raw_outputs):
        output_names = tuple(str(o.get("name")) for o in raw_outputs)
        unknown = sorted(set(output_names) - set(known_outputs))
        if unknown or not output_names:
            raise BodyIssue(
                "invalid_output_name",
                f"body.outputs must name outputs of {model.name!r}: {known_outputs}.",
                "body.outputs",
            )
    else:
        raise BodyIssue("invalid_outputs", "body.outputs must be a list of {'name': ...}.", "body.outputs")
    ordered = tuple(seen[spec["name"]] for spec in model.inputs)
    return TensorRequest(inputs=ordered, output_names=output_names)


def _parse_tensor_input(item: dict[str, Any], spec: dict[str, Any], param: str, max_batch_size: int) -> TensorInput:
    datatype = item.get("datatype")
    if datatype != spec["datatype"]:
        raise BodyIssue(
            "invalid_datatype",
            f"{param}.datatype must be {spec['datatype']!r}, got {quote(datatype)}.",
            f"{param}.datatype",
        )
    shape = item.get("shape")
    dims = list(spec["dims"])
    if (
        not isinstance(shape, list)
        or len(shape) != len(dims) + 1
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise BodyIssue(
            "invalid_shape",
            f"{param}.shape must be [rows] + {dims} (rows first, -1 means any), got {quote(shape)}.",
            f"{param}.shape",
        )
    if not 1 <= shape[0] <= max_batch_size:
        raise BodyIssue("invalid_shape", f"{param}.shape[0] (rows) must be 1..{max_batch_size}.", f"{param}.shape")
    for got, want in zip(shape[1:], dims, strict=True):
        if want != -1 and got != want:
            raise BodyIssue(
                "invalid_shape", f"{param}.shape must be [rows] + {dims}, got {quote(shape)}.", f"{param}.shape"
            )
    array = tensor_array(item.get("data"), datatype, f"{param}.data")
    if array.size != math.prod(shape):
        raise BodyIssue(
            "invalid_data",
            f"{param}.data has {array.size} values but shape {quote(shape)} needs {math.prod(shape)}.",
            f"{param}.data",
        )
    return TensorInput(name=item["name"], datatype=datatype, shape=tuple(shape), array=array.reshape(shape))
