"""Packing rules that decide dispatch speed: length order, batch size caps, spreading small shards."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kinds.base import Member, ParsedLine
from controlplane.kinds.embeddings import TEXT_BASE_COST, EmbeddingRequest, pack_embeddings
from controlplane.kinds.tensors.packing import call_rows, pack_tensors, tensor_body
from controlplane.kinds.tensors.requests import TensorInput, TensorRequest
from controlplane.kinds.tensors.values import NUMPY_TO_KSERVE


def _emb(texts: list[str]) -> dict[int, ParsedLine]:
    return {i + 1: ParsedLine(f"c{i}", "m", EmbeddingRequest((t,), "float")) for i, t in enumerate(texts)}


def _lengths(call) -> list[int]:
    return [len(row[0]) for row in call.inputs["TEXT"]]


def _cost(call) -> int:
    return sum(length + TEXT_BASE_COST for length in _lengths(call))


def test_texts_are_sorted_by_length_and_cut_into_calls_of_equal_cost_costliest_first():
    lines = _emb(["x" * (i * 7 % 50 + 1) for i in range(150)])
    calls = pack_embeddings(lines, 64)
    costs = [_cost(c) for c in calls]
    assert len(calls) >= 3 and all(len(c.members) <= 64 for c in calls), "150 texts: three calls of 64 at most"
    uncapped = [cost for call, cost in zip(calls, costs, strict=True) if len(call.members) < 64]
    assert max(uncapped) <= 1.1 * min(uncapped), costs
    assert costs == sorted(costs, reverse=True)
    assert [len(c.members) for c in calls] != [50, 50, 50], "equal cost, not equal counts"
    # Each call holds a run of the length order; no text is in two calls.
    for call in calls:
        assert _lengths(call) == sorted(_lengths(call))
    runs = sorted((min(_lengths(c)), max(_lengths(c))) for c in calls)
    assert all(high <= low for (_, high), (low, _) in pairwise(runs))
    assert sorted((m.line, m.slot) for c in calls for m in c.members) == [(n, 0) for n in range(1, 151)]
    assert sorted(len(c.members) for c in pack_embeddings(_emb(["t"] * 71), 64)) == [35, 36]
    assert [len(c.members) for c in pack_embeddings(_emb(["t"] * 64), 64)] == [64]


def test_short_texts_cut_at_max_batch_size_leave_the_long_ones_their_equal_share():
    # 64 one-character texts cost far less than a share; cut at the cap, they do not push the long ones into
    # fewer, costlier calls.
    calls = pack_embeddings(_emb(["s"] * 100 + ["l" * 400] * 20), 64)
    share = (100 * (1 + TEXT_BASE_COST) + 20 * (400 + TEXT_BASE_COST)) / 2
    assert all(len(c.members) <= 64 for c in calls)
    assert all(_cost(c) <= share + (400 + TEXT_BASE_COST) / 2 for c in calls)
    assert _lengths(calls[0])[-1] == 400 and _lengths(calls[-1])[0] == 1
    assert sum(len(c.members) for c in calls) == 120


def test_a_pathological_shard_packs_in_one_pass():
    calls = pack_embeddings(_emb(["s"] * 20000 + ["l" * 2000] * 500), 64)
    assert all(len(c.members) <= 64 for c in calls)
    assert sum(len(c.members) for c in calls) == 20500


def test_on_gpus_calls_hold_equal_counts():
    lines = _emb(["x" * (i * 7 % 50 + 1) for i in range(150)])
    calls = pack_embeddings(lines, 64, equal_cost=False)
    assert [len(c.members) for c in calls] == [50, 50, 50]
    flat = [length for c in reversed(calls) for length in _lengths(c)]
    assert flat == sorted(flat)


def test_a_small_shard_is_spread_over_the_calls_in_flight():
    calls = pack_embeddings(_emb(["t"] * 100), 64, min_calls=3)
    assert sorted(len(c.members) for c in calls) == [33, 33, 34]


def test_tensor_lines_stack_up_to_max_rows_and_keep_row_offsets():
    import numpy as np

    def line(rows: int) -> ParsedLine:
        array = np.ones((rows, 2), dtype=np.float32)
        return ParsedLine(
            "c", "identity", TensorRequest((TensorInput("INPUT0", "FP32", (rows, 2), array),), ("OUTPUT0",))
        )

    calls = pack_tensors({1: line(3), 2: line(4), 3: line(2)}, max_batch_size=8)
    assert [c.inputs["INPUT0"].shape[0] for c in calls] == [7, 2]
    assert [(m.line, m.start, m.rows) for m in calls[0].members] == [(1, 0, 3), (2, 3, 4)]


def _per_line_body(model_name: str, outputs: dict[str, np.ndarray], start: int, rows: int) -> dict:
    """What a line's body was when each line sliced and converted its own rows (the output-file format)."""
    converted = []
    for name, full in outputs.items():
        array = full[start : start + rows]
        if array.dtype == np.object_:
            datatype = "BYTES"
            data = [v.decode(errors="replace") if isinstance(v, bytes) else v for v in array.reshape(-1)]
        else:
            datatype, data = NUMPY_TO_KSERVE.get(array.dtype, "FP32"), array.reshape(-1).tolist()
        converted.append({"name": name, "datatype": datatype, "shape": list(array.shape), "data": data})
    return {"model_name": model_name, "model_version": "1", "outputs": converted}


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from([np.float32, np.float16, np.int8, np.uint64, np.bool_, np.float64, np.object_]),
    tail=st.lists(st.integers(0, 3), max_size=2),
    spans=st.lists(st.integers(1, 3), min_size=1, max_size=5),
)
def test_a_line_body_from_the_calls_rows_equals_the_per_line_conversion(dtype, tail, spans):
    total = sum(spans)
    values = np.arange(total * int(np.prod(tail or [1]))).reshape(total, *tail)
    array = (
        np.array([[b"x%d" % v for v in values.reshape(total, -1)[i]] for i in range(total)], dtype=np.object_).reshape(
            values.shape
        )
        if dtype is np.object_
        else (values / 3).astype(dtype)
    )
    outputs = {"Y": array, "Z": np.ones((total,), np.float32)}
    rows = call_rows(outputs)
    start = 0
    for span in spans:
        member = Member(line=start, slot=0, start=start, rows=span)
        assert tensor_body("m", rows, member) == _per_line_body("m", outputs, start, span)
        start += span
