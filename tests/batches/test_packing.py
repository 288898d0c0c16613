"""Packing rules that decide dispatch speed: length order, batch size caps, spreading small shards."""

from __future__ import annotations

from controlplane.batches.packing import pack_embeddings, pack_tensors
from controlplane.batches.requests import EmbeddingRequest, ParsedLine, TensorInput, TensorRequest


def _emb(texts: list[str]) -> dict[int, ParsedLine]:
    return {i + 1: ParsedLine(f"c{i}", "m", EmbeddingRequest((t,), "float")) for i, t in enumerate(texts)}


def test_texts_are_sorted_by_length_and_capped_at_max_batch_size():
    lines = _emb(["x" * (i * 7 % 50 + 1) for i in range(150)])
    calls = pack_embeddings(lines, 64)
    assert [len(c.members) for c in calls] == [64, 64, 22]
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
