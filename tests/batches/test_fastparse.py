"""The unchecked parse of validated tensor lines (batches/fastparse.py) gives exactly what the checked parse
gives (batches/requests.py), for every KServe datatype, with and without named outputs, and declines
(None) rather than guessing on anything it does not expect."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from controlplane.batches.fastparse import parse_validated_tensor_line
from controlplane.batches.requests import KSERVE_DTYPES, LineIssue, ModelResolver, parse_line
from controlplane.fleet.models import CatalogueModel

DTYPES = [d for d in KSERVE_DTYPES if d != "BYTES"]


def _model(datatype: str, width: int) -> CatalogueModel:
    return CatalogueModel(
        name=f"m-{datatype.lower()}",
        triton_name="m",
        kind="tensor",
        max_batch_size=8,
        inputs=[{"name": "A", "datatype": datatype, "dims": [width]}, {"name": "B", "datatype": "FP32", "dims": [-1]}],
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
def lines(draw):
    datatype = draw(st.sampled_from([*DTYPES, "BYTES"]))
    width = draw(st.integers(1, 4))
    rows = draw(st.integers(1, 3))
    values = st.text(max_size=5) if datatype == "BYTES" else _values(datatype)
    a = draw(st.lists(values, min_size=rows * width, max_size=rows * width))
    b_width = draw(st.integers(0, 3))
    b = draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=rows * b_width, max_size=rows * b_width))
    inputs = [
        {"name": "A", "datatype": datatype, "shape": [rows, width], "data": a},
        {"name": "B", "datatype": "FP32", "shape": [rows, b_width], "data": b},
    ]
    body = {"model": f"m-{datatype.lower()}", "inputs": draw(st.permutations(inputs))}
    if draw(st.booleans()):
        body["outputs"] = [{"name": "Z"}]
    line = {"custom_id": draw(st.text(min_size=1, max_size=8)), "method": "POST", "url": "/v2/infer", "body": body}
    return _model(datatype, width), json.dumps(line).encode()


@settings(max_examples=400, deadline=None)
@given(lines())
def test_fast_parse_equals_checked_parse(case):
    model, raw = case
    try:
        checked = parse_line(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
    except LineIssue:
        assume(False)  # validation refuses it (e.g. 2**63 - 1 next to a float): never reaches a shard
    fast = parse_validated_tensor_line(raw, model)
    assert fast is not None
    assert (fast.custom_id, fast.model_name) == (checked.custom_id, checked.model_name)
    assert fast.request.output_names == checked.request.output_names
    assert fast.request.signature() == checked.request.signature()
    for got, want in zip(fast.request.inputs, checked.request.inputs, strict=True):
        assert (got.name, got.datatype, got.shape) == (want.name, want.datatype, want.shape)
        assert got.array.dtype == want.array.dtype and got.array.shape == want.array.shape
        assert np.array_equal(got.array, want.array)


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
    assert parse_validated_tensor_line(json.dumps(_COMPLETE).encode(), _model("INT64", 1)) is not None


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
    assert parse_validated_tensor_line(raw, _model("INT64", 1)) is None
