"""Validation's fast lane (batches/intake/quickcheck.py) never disagrees with the checked parse: on generated lines,
good ones and ones broken in the ways tenants break them, it either declines (None) or answers exactly the
checked parse's custom_id, model and work units. It must also take the common good lines, or it buys nothing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.batches.intake.quickcheck import LineFacts, quick_check
from controlplane.batches.intake.requests import ModelResolver, work_units
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import LineIssue
from tests.kinds.test_tensors_fastparse import _model, lines
from tests.support.batches import parse_accepted

EMBEDDER = CatalogueModel(
    name="emb", triton_name="emb", kind="embeddings", max_batch_size=8, embedding_dimensions=384,
    inputs=[{"name": "TEXT", "datatype": "BYTES", "dims": [1]}],
    outputs=[{"name": "EMBEDDING", "datatype": "FP32", "dims": [384]}],
)  # fmt: skip

# The values that sit on a rule's edge, drawn often; then any JSON value.
EDGES = st.sampled_from(["", [], {}, [{}], [""], ["a", ""], 0, -1, 1.5, True, "x" * 513, "GET", 2**64, 1e300])
JSON_VALUES = EDGES | st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _checked(raw: bytes, endpoint: str, model: CatalogueModel) -> LineFacts | None:
    try:
        parsed = parse_accepted(raw, endpoint=endpoint, resolver=ModelResolver(model))
    except LineIssue:  # a refused body too: the lane only ever answers for lines validation accepts
        return None
    return LineFacts(parsed.custom_id, parsed.model_name, work_units(parsed, endpoint=endpoint))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _replace(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


@st.composite
def broken(draw, good: st.SearchStrategy) -> tuple[CatalogueModel, str, bytes]:
    """A good line, then one of: a value swapped anywhere for any JSON value, a key dropped or added, or a
    textual change (BOM, NaN, a huge integer, an escaped surrogate, a duplicate key, truncation)."""
    model, endpoint, raw = draw(good)
    obj = json.loads(raw)
    how = draw(st.sampled_from(["swap", "drop", "add", "text", "none"]))
    paths = _paths(obj)
    # Mostly the fields the rules are about; sometimes a value inside a tensor's data.
    structural = [p for p in paths if "data" not in p]
    path = draw(st.sampled_from(structural if draw(st.integers(0, 4)) else paths))
    if how == "swap":
        obj = _replace(obj, path, draw(JSON_VALUES))
    elif how in ("drop", "add") and path:
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and how == "drop":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=6))] = draw(JSON_VALUES)
        elif isinstance(parent, list) and how == "drop":
            del parent[path[-1]]
        else:
            parent.append(draw(JSON_VALUES))
    raw = json.dumps(obj).encode()
    if how == "text":
        edit = draw(st.sampled_from(["bom", "nan", "huge", "surrogate", "dup", "cut", "deep"]))
        raw = {
            "bom": b"\xef\xbb\xbf" + raw,
            "nan": raw.replace(b"1.0", b"NaN", 1),
            "huge": raw.replace(b"1.0", b"1" + b"0" * 30, 1),
            "surrogate": raw.replace(b'"custom_id": "', b'"custom_id": "\\ud800', 1),
            "dup": raw.replace(b'"method": "POST"', b'"method": "GET", "method": "POST"', 1),
            "cut": raw[: len(raw) // 2],
            "deep": raw.replace(b'"POST"', b'"POST", "x": ' + b"[" * 70 + b"]" * 70, 1),
        }[edit]
    return model, endpoint, raw


@st.composite
def tensor_lines(draw) -> tuple[CatalogueModel, str, bytes]:
    """The fast-parse test's generator (every datatype, corner values), or a plain line of the common
    shape that the fast lane should take, so that breaking it tests the lane's own checks."""
    if draw(st.booleans()):
        model, raw = draw(lines())
        return model, "/v2/infer", raw
    datatype = draw(st.sampled_from(["FP32", "FP16", "INT8", "INT64", "UINT8", "BYTES"]))
    model = _model(datatype, 2)
    rows = draw(st.integers(1, 3))
    value = {"BYTES": st.text(max_size=3), "FP32": st.floats(-1e6, 1e6), "FP16": st.integers(-9, 9)}.get(
        datatype, st.integers(0, 100)
    )
    body: dict[str, Any] = {
        "model": model.name,
        "inputs": [
            {"name": "A", "datatype": datatype, "shape": [rows, 2], "data": draw(st.lists(value, min_size=2 * rows, max_size=2 * rows))},
            {"name": "B", "datatype": "FP32", "shape": [rows, 1], "data": [1.0] * rows},
        ],
    }  # fmt: skip
    if draw(st.booleans()):
        body["outputs"] = [{"name": "Z"}, {"name": "Y"}]
    line = {"custom_id": draw(st.text(min_size=1, max_size=8)), "method": "POST", "url": "/v2/infer", "body": body}
    return model, "/v2/infer", json.dumps(line).encode()


@st.composite
def embedding_lines(draw) -> tuple[CatalogueModel, str, bytes]:
    text = st.text(min_size=1, max_size=12)
    given_input = draw(st.one_of(text, st.lists(text, min_size=1, max_size=4)))
    body: dict[str, Any] = {"model": "emb", "input": given_input}
    if draw(st.booleans()):
        body["encoding_format"] = draw(st.sampled_from(["float", "base64"]))
    if draw(st.booleans()):
        body["dimensions"] = 384
    line = {"custom_id": draw(st.text(min_size=1, max_size=8)), "method": "POST", "url": "/v1/embeddings", "body": body}
    return EMBEDDER, "/v1/embeddings", json.dumps(line, ensure_ascii=draw(st.booleans())).encode()


@settings(max_examples=1500, deadline=None)
@given(st.one_of(tensor_lines(), embedding_lines(), broken(tensor_lines()), broken(embedding_lines())))
def test_the_fast_lane_declines_or_agrees(case):
    model, endpoint, raw = case
    fast = quick_check(raw, endpoint=endpoint, model=model)
    if fast is not None:
        assert fast == _checked(raw, endpoint, model)


@pytest.mark.django_db
def test_integers_past_int64_are_left_to_the_checked_parse():
    """Found by the property above: beside a small value, numpy infers float64 for 2**64 - 1024 (which
    rounds to 2**64). The lane leaves such a line to the checked parse, which takes the values exactly."""
    model = _model("UINT64", 2)
    line = _replace(_GOOD_TENSOR, ("body", "model"), model.name)
    line = _replace(line, ("body", "inputs", 0, "datatype"), "UINT64")
    line = _replace(line, ("body", "inputs", 0, "data"), [0, 2**64 - 1024])
    line["body"].pop("outputs")
    raw = json.dumps(line).encode()
    assert _checked(raw, "/v2/infer", model) is not None
    assert quick_check(raw, endpoint="/v2/infer", model=model) is None


def test_the_common_lines_take_the_fast_lane():
    identity = _model("FP32", 4)
    line = {
        "custom_id": "r-1", "method": "POST", "url": "/v2/infer",
        "body": {"model": identity.name, "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [1, 4], "data": [0.0, 1.0, 2.0, 3]},
            {"name": "B", "datatype": "FP32", "shape": [1, 1], "data": [1.5]},
        ]},
    }  # fmt: skip
    assert quick_check(json.dumps(line).encode(), endpoint="/v2/infer", model=identity) == LineFacts(
        "r-1", identity.name, 1
    )
    text = {"custom_id": "é-1", "method": "POST", "url": "/v1/embeddings", "body": {"model": "emb", "input": "héllo"}}
    assert quick_check(json.dumps(text).encode(), endpoint="/v1/embeddings", model=EMBEDDER) == LineFacts(
        "é-1", "emb", 5 // 4 + 2
    )
    # The wrong endpoint for the model, or another model's name: the checked parse writes those errors.
    assert quick_check(json.dumps(text).encode(), endpoint="/v2/infer", model=EMBEDDER) is None
    assert quick_check(json.dumps(line).encode(), endpoint="/v2/infer", model=EMBEDDER) is None


_GOOD_TENSOR = {
    "custom_id": "r-1", "method": "POST", "url": "/v2/infer",
    "body": {"model": "m-fp16", "inputs": [
        {"name": "A", "datatype": "FP16", "shape": [1, 2], "data": [1.0, 2]},
        {"name": "B", "datatype": "FP32", "shape": [1, 1], "data": [1.5]},
    ], "outputs": [{"name": "Y"}]},
}  # fmt: skip
_GOOD_TEXT = {
    "custom_id": "t",
    "method": "POST",
    "url": "/v1/embeddings",
    "body": {"model": "emb", "input": ["a", "b"]},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("custom_id",), "x" * 513), (("custom_id",), ""), (("method",), "GET"), (("url",), "/v1/embeddings"),
        (("body", "model"), "other"), (("body", "inputs"), []), (("body", "inputs", 1, "name"), "A"),
        (("body", "inputs", 0, "datatype"), "FP32"), (("body", "inputs", 0, "shape"), [1, 3]),
        (("body", "inputs", 0, "shape"), [0, 2]), (("body", "inputs", 0, "shape"), [9, 2]),
        (("body", "inputs", 0, "shape"), [1, True]), (("body", "inputs", 0, "data"), [1.0]),
        (("body", "inputs", 0, "data"), [1.0, 70000.0]), (("body", "inputs", 0, "data"), [1.0, "2"]),
        (("body", "inputs", 0, "data"), [1.0, [2.0]]), (("body", "inputs", 1, "shape"), [2, 1]),
        (("body", "outputs"), []), (("body", "outputs"), ["Y"]), (("body", "outputs"), [{"name": "Q"}]),
    ],
)  # fmt: skip
@pytest.mark.django_db
def test_each_tensor_rule_is_kept(path, value):
    line = _replace(_GOOD_TENSOR, path, value)
    raw = json.dumps(line).encode()
    assert _checked(raw, "/v2/infer", _model("FP16", 2)) is None, "the case must break a rule"
    assert quick_check(raw, endpoint="/v2/infer", model=_model("FP16", 2)) is None


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("body", "input"), ""), (("body", "input"), []), (("body", "input"), ["a", ""]),
        (("body", "input"), ["a", 1]), (("body", "input"), ["a"] * 2049), (("body", "encoding_format"), "int8"),
        (("body", "dimensions"), 128),
    ],
)  # fmt: skip
def test_each_embedding_rule_is_kept(path, value):
    line = _replace(_GOOD_TEXT, path, value) if path[-1] in _GOOD_TEXT["body"] else _with(_GOOD_TEXT, path, value)
    raw = json.dumps(line).encode()
    assert _checked(raw, "/v1/embeddings", EMBEDDER) is None, "the case must break a rule"
    assert quick_check(raw, endpoint="/v1/embeddings", model=EMBEDDER) is None


def test_the_good_cases_above_are_taken():
    assert quick_check(json.dumps(_GOOD_TENSOR).encode(), endpoint="/v2/infer", model=_model("FP16", 2)) is not None
    assert quick_check(json.dumps(_GOOD_TEXT).encode(), endpoint="/v1/embeddings", model=EMBEDDER) is not None


def _with(line: dict, path: tuple, value: Any) -> dict:
    body = {**line["body"], path[-1]: value}
    return {**line, "body": body}


# Nested one level past the limit in each way brackets can add up: the guard counts both kinds, so any other
# arithmetic of the two counts lets one of these through (and the checked parse refuses all three).
_TOO_DEEP = {
    "arrays": b"[" * 65 + b"]" * 65,
    "objects": b'{"a": ' * 65 + b"1" + b"}" * 65,
    "alternating": b'{"a": [' * 33 + b"1" + b"]}" * 33,
}


@pytest.mark.parametrize("shape", sorted(_TOO_DEEP))
def test_a_line_nested_past_the_limit_is_left_to_the_checked_parse(shape):
    model = _model("FP16", 2)
    raw = json.dumps(_GOOD_TENSOR).encode().replace(b'"POST"', b'"POST", "x": ' + _TOO_DEEP[shape], 1)
    assert _checked(raw, "/v2/infer", model) is None, "the checked parse refuses it"
    assert quick_check(raw, endpoint="/v2/infer", model=model) is None


def test_a_model_of_another_kind_than_the_endpoints_is_never_taken():
    """The same line for two models that differ only in kind: taken for the model of the endpoint's kind, left
    to the checked parse (which says which endpoint the model serves) for the other."""
    tensor_twin = CatalogueModel(
        name="emb", triton_name="emb", kind="tensor", max_batch_size=8, inputs=EMBEDDER.inputs, outputs=EMBEDDER.outputs
    )
    text = json.dumps({**_GOOD_TEXT, "body": {"model": "emb", "input": "hello"}}).encode()
    assert quick_check(text, endpoint="/v1/embeddings", model=EMBEDDER) is not None
    assert quick_check(text, endpoint="/v1/embeddings", model=tensor_twin) is None
    body = {"model": "emb", "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}
    tensor = json.dumps({**_GOOD_TENSOR, "body": body}).encode()
    assert quick_check(tensor, endpoint="/v2/infer", model=tensor_twin) is not None
    assert quick_check(tensor, endpoint="/v2/infer", model=EMBEDDER) is None
