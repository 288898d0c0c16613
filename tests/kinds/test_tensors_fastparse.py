"""The unchecked parse of validated tensor lines (kinds/tensors/fast.py) gives exactly what the checked parse
gives (kinds/tensors/requests.py), for every KServe datatype, with and without named outputs, and declines
(None) rather than guessing on anything it does not expect."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from controlplane.batches.intake.requests import ModelResolver
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import LineIssue
from controlplane.kinds.tensors.fast import ValidatedTensorLines
from controlplane.kinds.tensors.packing import pack_tensors
from controlplane.kinds.tensors.requests import RawTensorRequest
from controlplane.kinds.tensors.values import KSERVE_DTYPES
from tests.support.batches import parse_accepted

DTYPES = [d for d in KSERVE_DTYPES if d != "BYTES"]


def _model(datatype: str, width: int, *, b_datatype: str | None = "FP32") -> CatalogueModel:
    """Input A of ``datatype`` and ``width``, and input B of ``b_datatype`` and any width (none when None)."""
    b = [{"name": "B", "datatype": b_datatype, "dims": [-1]}] if b_datatype else []
    return CatalogueModel(
        name=f"m-{datatype.lower()}",
        triton_name="m",
        kind="tensor",
        max_batch_size=8,
        inputs=[{"name": "A", "datatype": datatype, "dims": [width]}, *b],
        outputs=[{"name": "Y", "datatype": datatype, "dims": [width]}, {"name": "Z", "datatype": "FP32", "dims": [1]}],
    )


def _values(datatype: str) -> st.SearchStrategy:
    if datatype == "BOOL":
        return st.sampled_from([True, False, 0, 1])
    if datatype.startswith(("INT", "UINT")):
        info = np.iinfo(KSERVE_DTYPES[datatype])
        whole = st.integers(int(info.min), int(info.max))
        # Whole floats are valid integer values too (validation accepts 3.0 for an INT8).
        return st.one_of(whole, st.integers(max(int(info.min), -(2**52)), min(int(info.max), 2**52)).map(float))
    limit = float(np.finfo(KSERVE_DTYPES[datatype]).max)
    return st.one_of(st.floats(-limit, limit, allow_nan=False, allow_infinity=False), st.integers(-1000, 1000))


@st.composite
def lines(draw, datatype=None, width=None, b_datatype=None):
    """A line for a model with input A and, mostly, input B of any datatype; or A alone (the one-input
    models, which the parse takes on a shortcut)."""
    datatype = datatype or draw(st.sampled_from([*DTYPES, "BYTES"]))
    width = width or draw(st.integers(1, 4))
    if b_datatype is None:
        b_datatype = draw(st.sampled_from(["FP32", "FP32", *DTYPES, "BYTES", ""]))  # "": no input B
    rows = draw(st.integers(1, 3))
    values = st.text(max_size=5) if datatype == "BYTES" else _values(datatype)
    a = draw(st.lists(values, min_size=rows * width, max_size=rows * width))
    inputs = [{"name": "A", "datatype": datatype, "shape": [rows, width], "data": a}]
    if b_datatype:
        b_width = draw(st.integers(0, 3))
        b_values = st.text(max_size=5) if b_datatype == "BYTES" else _values(b_datatype)
        b = draw(st.lists(b_values, min_size=rows * b_width, max_size=rows * b_width))
        inputs.append({"name": "B", "datatype": b_datatype, "shape": [rows, b_width], "data": b})
    body = {"model": f"m-{datatype.lower()}", "inputs": draw(st.permutations(inputs))}
    if draw(st.booleans()):
        body["outputs"] = [{"name": "Z"}]
    line = {"custom_id": draw(st.text(min_size=1, max_size=8)), "method": "POST", "url": "/v2/infer", "body": body}
    return _model(datatype, width, b_datatype=b_datatype or None), json.dumps(line).encode()


def _arrays(request) -> tuple[np.ndarray, ...]:
    return request.arrays() if isinstance(request, RawTensorRequest) else tuple(i.array for i in request.inputs)


def _assert_same_arrays(got, want) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)


@settings(max_examples=400, deadline=None)
@given(lines())
def test_fast_parse_equals_checked_parse(case):
    model, raw = case
    try:
        checked = parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
    except LineIssue:
        assume(False)  # validation refuses it (e.g. 2**63 - 1 next to a float): never reaches a shard
    fast = ValidatedTensorLines(model).parse(raw)
    assert fast is not None
    assert (fast.custom_id, fast.model_name) == (checked.custom_id, checked.model_name)
    assert fast.request.output_names == checked.request.output_names
    assert fast.request.signature() == checked.request.signature()
    assert fast.request.rows == checked.request.rows
    _assert_same_arrays(_arrays(fast.request), _arrays(checked.request))


@st.composite
def shards(draw):
    """Several lines of one model: a shard, whose calls stack them."""
    datatype = draw(st.sampled_from([*DTYPES, "BYTES"]))
    width = draw(st.integers(1, 4))
    b_datatype = draw(st.sampled_from(["FP32", *DTYPES, "BYTES", ""]))
    drawn = draw(st.lists(lines(datatype, width, b_datatype), min_size=1, max_size=8))
    return drawn[0][0], [raw for _, raw in drawn]


@settings(max_examples=300, deadline=None)
@given(shards())
def test_calls_stacked_from_fast_lines_equal_calls_from_checked_lines(case):
    """The fast lines' lists become one array per call (tensors.packing._stack_raw): the same values, types and
    shapes as stacking the checked parse's per-line arrays, whatever mix of ints, floats and bools."""
    model, raws = case
    checked, fast = {}, {}
    parser = ValidatedTensorLines(model)
    for number, raw in enumerate(raws, start=1):
        try:
            checked[number] = parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
        except LineIssue:
            continue
        fast[number] = parser.parse(raw)
    assume(checked)
    want, got = pack_tensors(checked, model.max_batch_size), pack_tensors(fast, model.max_batch_size)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.members == b.members and a.output_names == b.output_names
        assert list(a.inputs) == list(b.inputs)
        _assert_same_arrays(a.inputs.values(), b.inputs.values())


def test_mixed_value_types_in_one_call_are_cast_line_by_line():
    """Integers past 2**53 beside floats: one float64 list would round them before the cast; line by line
    (as validation inferred them) they keep int64's exactness, and so do the stacked calls."""
    model = _model("INT64", 1)
    big = 2**62 + 1

    def line(value):
        return json.dumps(
            {
                **_COMPLETE,
                "body": {
                    **_COMPLETE["body"],
                    "inputs": [{**_COMPLETE["body"]["inputs"][0], "data": [value]}, _COMPLETE["body"]["inputs"][1]],
                },
            }
        ).encode()

    parser = ValidatedTensorLines(model)
    calls = pack_tensors({1: parser.parse(line(big)), 2: parser.parse(line(3.0))}, 8)
    assert calls[0].inputs["A"].dtype == np.int64
    assert calls[0].inputs["A"][:, 0].tolist() == [big, 3]


@pytest.mark.parametrize(
    ("datatype", "data", "exact"),
    [
        ("INT64", [2**53 + 1, 1.0], [2**53 + 1, 1]),
        ("UINT64", [2**64 - 1, 0.0], [2**64 - 1, 0]),
        ("INT64", [-(2**63), 2.0], [-(2**63), 2]),
        ("UINT64", [2**64, 0.0], None),  # out of range, however it is written
        ("INT64", [2**53 + 1, 1.5], None),  # not a whole number
    ],
)
def test_big_integers_beside_floats_keep_every_digit(datatype, data, exact):
    """numpy infers float64 for ints beside a float, which rounds past 2**53: the checked parse and the fast
    path both take such values exactly (or refuse them) instead of altering or wrongly refusing them."""
    model = _model(datatype, 2)
    body = {
        "model": model.name,
        "inputs": [
            {"name": "A", "datatype": datatype, "shape": [1, 2], "data": data},
            {"name": "B", "datatype": "FP32", "shape": [1, 0], "data": []},
        ],
    }
    raw = json.dumps({"custom_id": "x", "method": "POST", "url": "/v2/infer", "body": body}).encode()
    if exact is None:
        with pytest.raises(LineIssue, match=r"out of range|must hold"):
            parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
        return
    checked = parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
    assert _arrays(checked.request)[0].ravel().tolist() == exact
    fast = ValidatedTensorLines(model).parse(raw)
    assert fast is not None and _arrays(fast.request)[0].ravel().tolist() == exact


_COMPLETE = {
    "custom_id": "x",
    "method": "POST",
    "url": "/v2/infer",
    "body": {
        "model": "m-int64",
        "inputs": [
            {"name": "A", "datatype": "INT64", "shape": [1, 1], "data": [1]},
            {"name": "B", "datatype": "FP32", "shape": [1, 0], "data": []},
        ],
    },
}


def test_a_complete_line_is_taken():
    assert ValidatedTensorLines(_model("INT64", 1)).parse(json.dumps(_COMPLETE).encode()) is not None


@pytest.mark.parametrize(
    "raw",
    [
        b"\xef\xbb\xbf" + json.dumps(_COMPLETE).encode(),  # a BOM (validation accepts one on any line)
        json.dumps({**_COMPLETE, "body": {**_COMPLETE["body"], "inputs": _COMPLETE["body"]["inputs"][:1]}}).encode(),
        b'{"custom_id": "x"}',
        b"not json",
    ],
    ids=["bom", "missing-input", "no-body", "not-json"],
)
def test_anything_unexpected_is_declined_for_the_checked_parse(raw):
    assert ValidatedTensorLines(_model("INT64", 1)).parse(raw) is None


@pytest.mark.parametrize("name", ["0", "Z", "a"])
def test_a_one_input_line_naming_another_input_is_declined(name):
    """One-input models take a shortcut (the line's only input is the model's); a line whose only input has
    another name is not guessed at: validation would have refused it, so the caller's checked parse decides."""
    model = _model("INT64", 1, b_datatype=None)
    line = {**_COMPLETE, "body": {"model": model.name, "inputs": [{**_COMPLETE["body"]["inputs"][0], "name": name}]}}
    assert ValidatedTensorLines(model).parse(json.dumps(line).encode()) is None
    right = {**line, "body": {**line["body"], "inputs": [_COMPLETE["body"]["inputs"][0]]}}
    assert ValidatedTensorLines(model).parse(json.dumps(right).encode()) is not None


def test_big_integers_beside_a_bytes_input_keep_every_digit():
    """Found by the stacking property once input B could be BYTES: a line with a BYTES input keeps one array per
    input, and its integer input was cast from numpy's float64 inference, so 2**63 + 1 beside a 0 became 2**63.
    It is cast as the checked parse casts now (tensors.values.exact_integers)."""
    model = _model("UINT64", 2, b_datatype="BYTES")
    body = {
        "model": model.name,
        "inputs": [
            {"name": "A", "datatype": "UINT64", "shape": [1, 2], "data": [0.0, 2**63 + 1]},
            {"name": "B", "datatype": "BYTES", "shape": [1, 1], "data": ["x"]},
        ],
    }
    raw = json.dumps({"custom_id": "x", "method": "POST", "url": "/v2/infer", "body": body}).encode()
    checked = parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
    fast = ValidatedTensorLines(model).parse(raw)
    assert fast is not None
    assert _arrays(checked.request)[0].ravel().tolist() == [0, 2**63 + 1]
    _assert_same_arrays(_arrays(fast.request), _arrays(checked.request))


def _sample(datatype: str) -> list:
    return {
        "BOOL": [True, False],
        "BYTES": ["x", ""],
        "FP16": [1.5, -2.0],
        "FP32": [1.5, -2.0],
        "FP64": [1.5, -2.0],
    }.get(datatype, [1, 0])


@pytest.mark.parametrize("other", [*DTYPES, "BYTES"])
def test_a_line_with_a_bytes_input_parses_its_other_input_of_each_datatype_as_the_checked_parse(other):
    """A line with a BYTES input keeps one array per input (no stacking from lists); its other input, of every
    datatype, has the checked parse's values, type and shape (the property draws this pairing rarely)."""
    model = _model("BYTES", 2, b_datatype=other)
    body = {
        "model": model.name,
        "inputs": [
            {"name": "A", "datatype": "BYTES", "shape": [1, 2], "data": ["a", "b"]},
            {"name": "B", "datatype": other, "shape": [1, 2], "data": _sample(other)},
        ],
    }
    raw = json.dumps({"custom_id": "x", "method": "POST", "url": "/v2/infer", "body": body}).encode()
    checked = parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
    fast = ValidatedTensorLines(model).parse(raw)
    assert fast is not None
    _assert_same_arrays(_arrays(fast.request), _arrays(checked.request))
