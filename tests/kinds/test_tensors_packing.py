"""Packing rules that decide dispatch speed: length order, batch size caps, spreading small shards."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.kinds.base import Member, ParsedLine
from controlplane.kinds.embeddings import EmbeddingRequest, pack_embeddings
from controlplane.kinds.tensors.packing import call_rows, pack_tensors, tensor_body
from controlplane.kinds.tensors.requests import TensorInput, TensorRequest
from controlplane.kinds.tensors.values import NUMPY_TO_KSERVE


def _emb(texts: list[str]) -> dict[int, ParsedLine]:
    return {i + 1: ParsedLine(f"c{i}", "m", EmbeddingRequest((t,), "float")) for i, t in enumerate(texts)}


def test_texts_are_sorted_by_length_and_capped_at_max_batch_size_in_even_calls():
    lines = _emb(["x" * (i * 7 % 50 + 1) for i in range(150)])
    calls = pack_embeddings(lines, 64)
    assert [len(c.members) for c in calls] == [50, 50, 50], "three calls are needed; none is left a tail"
    assert [len(c.members) for c in pack_embeddings(_emb(["t"] * 71), 64)] == [36, 35]
    assert [len(c.members) for c in pack_embeddings(_emb(["t"] * 64), 64)] == [64]
    lengths = [len(row[0]) for c in calls for row in c.inputs["TEXT"]]
    assert lengths == sorted(lengths)
    assert sorted((m.line, m.slot) for c in calls for m in c.members) == [(n, 0) for n in range(1, 151)]


def test_a_small_shard_is_spread_over_the_calls_in_flight():
    calls = pack_embeddings(_emb(["t"] * 100), 64, min_calls=3)
    assert [len(c.members) for c in calls] == [34, 34, 32]


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
