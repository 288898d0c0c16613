"""Parsing one input line into a typed request. Shared by validation (whole file, before any work)
and dispatch (one shard), so both agree on what a line means."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from controlplane.batches.lines import LineIssue, load_json_line
from controlplane.batches.models import Endpoint
from controlplane.core.errors import quote
from controlplane.fleet.models import CatalogueModel, ModelKind

__all__ = ["LineIssue", "ModelResolver", "ParsedLine", "parse_line", "work_units"]

# OpenAI's own limit on inputs per embeddings request.
MAX_EMBEDDING_INPUTS = 2048

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


# (name, datatype, non-batch dims) per input, then ("outputs", names, ()): lines that share one stack.
Signature = tuple[tuple[str, str, tuple[int, ...]], ...]


@dataclass(frozen=True)
class EmbeddingRequest:
    texts: tuple[str, ...]
    encoding_format: str


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
    """A validated tensor line's inputs as its JSON gave them (batches/fastparse.py): the values are cast
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
        # Inferred first, then cast, exactly as the checked parse does (_tensor_array).
        return tuple(
            _exact_integers(values, np.asarray(values), np.dtype(KSERVE_DTYPES[datatype]))
            .astype(KSERVE_DTYPES[datatype])
            .reshape(shape)
            for values, datatype, shape in zip(self.values, self.datatypes, self.shapes, strict=True)
        )


class ParsedLine(NamedTuple):
    """A NamedTuple rather than a frozen dataclass: a shard builds one per line, at half the cost."""

    custom_id: str
    model_name: str
    # None for a line run from its shard's columns (batches/columns.py): its call was packed from them.
    request: EmbeddingRequest | TensorRequest | RawTensorRequest | None


def work_units(parsed: ParsedLine) -> int:
    """What a line costs the model, in the unit fair share is charged in: rows for tensor models,
    tokens for text. Tokens are estimated here (about four characters per word piece, plus the two
    special tokens) and replaced by the tokenizer's count when the shard commits."""
    request = parsed.request
    if isinstance(request, (TensorRequest, RawTensorRequest)):
        return request.rows
    assert request is not None, "a parsed line carries its request"
    return sum(len(text) // 4 + 2 for text in request.texts)


class ModelResolver:
    """Looks catalogue models up once per name for the life of one validation or shard run. A shard
    run passes its batch's pinned entry (batches/pinning.py), which answers for its name whatever the
    catalogue says now."""

    def __init__(self, pinned: CatalogueModel | None = None) -> None:
        self._cache: dict[str, CatalogueModel | None] = {} if pinned is None else {pinned.name: pinned}

    def get(self, name: str) -> CatalogueModel | None:
        if name not in self._cache:
            # Postgres cannot hold a NUL in text, so no model has one (and the query itself would fail).
            found = None if "\x00" in name else CatalogueModel.objects.filter(name=name, is_enabled=True).first()
            self._cache[name] = found
        return self._cache[name]


def parse_line(raw: bytes, *, endpoint: str, resolver: ModelResolver) -> ParsedLine:
    obj = load_json_line(raw)
    if not isinstance(obj, dict):
        raise LineIssue("invalid_request", "Each line must be a JSON object.")
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise LineIssue("missing_custom_id", "Each line needs a non-empty string 'custom_id'.", "custom_id")
    if len(custom_id) > 512:
        raise LineIssue("invalid_custom_id", "custom_id must be at most 512 characters.", "custom_id")
    if obj.get("method") != "POST":
        raise LineIssue("invalid_method", f"method must be 'POST', got {quote(obj.get('method'))}.", "method")
    if obj.get("url") != endpoint:
        raise LineIssue(
            "mismatched_url",
            f"url must be the batch's endpoint {endpoint!r}, got {quote(obj.get('url'))}.",
            "url",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineIssue("invalid_body", "body must be a JSON object.", "body")
    model_name = body.get("model")
    if not isinstance(model_name, str) or not model_name:
        raise LineIssue("missing_model", "body.model must name a model.", "body.model")
    model = resolver.get(model_name)
    if model is None:
        raise LineIssue("model_not_found", f"The model {quote(model_name)} does not exist.", "body.model")
    expected_kind = ModelKind.EMBEDDINGS if endpoint == Endpoint.EMBEDDINGS else ModelKind.TENSOR
    if model.kind != expected_kind:
        raise LineIssue(
            "invalid_model",
            f"Model {model_name!r} serves {model.get_kind_display()}, not {endpoint}.",
            "body.model",
        )
    if expected_kind == ModelKind.EMBEDDINGS:
        request: EmbeddingRequest | TensorRequest = _parse_embedding(body, model)
    else:
        request = _parse_tensor(body, model)
    return ParsedLine(custom_id=custom_id, model_name=model_name, request=request)


def _parse_embedding(body: dict[str, Any], model: CatalogueModel) -> EmbeddingRequest:
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        texts: list[Any] = [raw_input]
    elif isinstance(raw_input, list) and raw_input:
        texts = raw_input
    else:
        raise LineIssue(
            "invalid_input",
            "body.input must be a non-empty string or a non-empty list of strings.",
            "body.input",
        )
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise LineIssue(
            "invalid_input",
            f"body.input has {len(texts)} items; the limit is {MAX_EMBEDDING_INPUTS}.",
            "body.input",
        )
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise LineIssue(
                "invalid_input",
                f"body.input[{i}] must be a string (token arrays are not supported), got {type(text).__name__}.",
                "body.input",
            )
        if not text:
            raise LineIssue("invalid_input", f"body.input[{i}] must not be empty.", "body.input")
    encoding_format = body.get("encoding_format", "float")
    if encoding_format not in ("float", "base64"):
        raise LineIssue("invalid_value", "body.encoding_format must be 'float' or 'base64'.", "body.encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != model.embedding_dimensions:
        raise LineIssue(
            "invalid_value",
            f"Model {model.name!r} produces {model.embedding_dimensions} dimensions; "
            "omit body.dimensions or set it to that.",
            "body.dimensions",
        )
    return EmbeddingRequest(texts=tuple(texts), encoding_format=encoding_format)


def _parse_tensor(body: dict[str, Any], model: CatalogueModel) -> TensorRequest:
    raw_inputs = body.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise LineIssue("invalid_inputs", "body.inputs must be a non-empty list.", "body.inputs")
    specs = {spec["name"]: spec for spec in model.inputs}
    seen: dict[str, TensorInput] = {}
    for i, item in enumerate(raw_inputs):
        param = f"body.inputs[{i}]"
        if not isinstance(item, dict):
            raise LineIssue("invalid_inputs", f"{param} must be an object.", param)
        name = item.get("name")
        if not isinstance(name, str) or name not in specs:  # a list or object as name is unhashable
            raise LineIssue(
                "invalid_input_name",
                f"{param}.name {quote(name)} is not an input of {model.name!r}; inputs are {sorted(specs)}.",
                f"{param}.name",
            )
        if name in seen:
            raise LineIssue("invalid_input_name", f"Input {quote(name)} is given twice.", f"{param}.name")
        seen[name] = _parse_tensor_input(item, specs[name], param, model.max_batch_size)
    missing = sorted(set(specs) - set(seen))
    if missing:
        raise LineIssue("missing_input", f"Inputs {missing} are required by {model.name!r}.", "body.inputs")
    rows = {t.shape[0] for t in seen.values()}
    if len(rows) != 1:
        raise LineIssue("invalid_shape", "All inputs must have the same first (batch) dimension.", "body.inputs")
    known_outputs = [spec["name"] for spec in model.outputs]
    raw_outputs = body.get("outputs")
    if raw_outputs is None:
        output_names = tuple(known_outputs)
    elif isinstance(raw_outputs, list) and all(isinstance(o, dict) for o in raw_outputs):
        output_names = tuple(str(o.get("name")) for o in raw_outputs)
        unknown = sorted(set(output_names) - set(known_outputs))
        if unknown or not output_names:
            raise LineIssue(
                "invalid_output_name",
                f"body.outputs must name outputs of {model.name!r}: {known_outputs}.",
                "body.outputs",
            )
    else:
        raise LineIssue("invalid_outputs", "body.outputs must be a list of {'name': ...}.", "body.outputs")
    ordered = tuple(seen[spec["name"]] for spec in model.inputs)
    return TensorRequest(inputs=ordered, output_names=output_names)


def _parse_tensor_input(item: dict[str, Any], spec: dict[str, Any], param: str, max_batch_size: int) -> TensorInput:
    datatype = item.get("datatype")
    if datatype != spec["datatype"]:
        raise LineIssue(
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
        raise LineIssue(
            "invalid_shape",
            f"{param}.shape must be [rows] + {dims} (rows first, -1 means any), got {quote(shape)}.",
            f"{param}.shape",
        )
    if not 1 <= shape[0] <= max_batch_size:
        raise LineIssue("invalid_shape", f"{param}.shape[0] (rows) must be 1..{max_batch_size}.", f"{param}.shape")
    for got, want in zip(shape[1:], dims, strict=True):
        if want != -1 and got != want:
            raise LineIssue(
                "invalid_shape", f"{param}.shape must be [rows] + {dims}, got {quote(shape)}.", f"{param}.shape"
            )
    array = _tensor_array(item.get("data"), datatype, f"{param}.data")
    if array.size != math.prod(shape):
        raise LineIssue(
            "invalid_data",
            f"{param}.data has {array.size} values but shape {quote(shape)} needs {math.prod(shape)}.",
            f"{param}.data",
        )
    return TensorInput(name=item["name"], datatype=datatype, shape=tuple(shape), array=array.reshape(shape))


def _tensor_array(data: Any, datatype: str, param: str) -> np.ndarray:
    """The values of one input as an array of its KServe type, every value checked to fit: numpy would
    otherwise wrap 1000 into an INT8, truncate 1.5, turn 1e39 into an FP32 inf or "1" into 1.0."""
    if not isinstance(data, list):
        raise LineIssue("invalid_data", f"{param} must be a list of {datatype} values, got {quote(data)}.", param)
    try:
        # Numbers are inferred first (bool, int64/uint64, float64; str or object means a wrong value).
        array = np.asarray(data, dtype=np.object_) if datatype == "BYTES" else np.asarray(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise LineIssue("invalid_data", f"{param} does not hold {datatype} values: {str(exc)[:200]}.", param) from exc
    if datatype == "BYTES":
        bad = next((v for v in array.flat if not isinstance(v, str)), None)
        if bad is not None:
            raise LineIssue("invalid_data", f"{param} must hold strings for BYTES, got {quote(bad)}.", param)
        return array
    if array.dtype.kind not in "biuf":
        raise LineIssue("invalid_data", f"{param} must hold only numbers (within range) for {datatype}.", param)
    target = np.dtype(KSERVE_DTYPES[datatype])
    array = _exact_integers(data, array, target)
    if array.size:
        bad_value, want = _first_out_of_range(array, target)
        if bad_value is not None:
            raise LineIssue(
                "invalid_data", f"{param} value {quote(bad_value)} is out of range: {datatype} takes {want}.", param
            )
    return array.astype(target)


# Integers beyond ±2**53 lose digits as float64, the type numpy infers for ints beside a float.
_FLOAT_EXACT = 2**53


def _exact_integers(data: list[Any], inferred: np.ndarray, target: np.dtype[Any]) -> np.ndarray:
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
