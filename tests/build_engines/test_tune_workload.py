"""The tuner's offered load (build_engines/tune_measure.Workload): every candidate shape is measured on the same
texts, the whole corpus, whatever its rows a call. No server: the calls are only built."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from build_engines.tune_measure import Workload

TYPE_STRING = 13  # model_config.proto's DataType


def _config() -> SimpleNamespace:
    return SimpleNamespace(
        input=[SimpleNamespace(name="TEXT", data_type=TYPE_STRING, dims=[1])],
        output=[SimpleNamespace(name="EMBEDDING")],
    )


CORPUS = [("word " * (1 + i % 97)).strip() + f" {i}" for i in range(768)]


@pytest.mark.parametrize(("rows", "concurrency"), [(8, 6), (16, 6), (32, 6), (64, 6), (16, 1), (5, 3)])
def test_the_calls_of_all_clients_carry_the_whole_corpus_evenly(rows, concurrency):
    workload = Workload(_config(), CORPUS, dynamic_dim=1)
    sent = Counter(
        text.decode()
        for worker in range(concurrency)
        for call in workload.client_calls(rows, worker, concurrency)
        for text in call["TEXT"].ravel()
    )
    assert set(sent) == set(CORPUS)  # no shape sees only the short (or the long) end of it
    assert max(sent.values()) - min(sent.values()) <= 1  # each text as often as any other, to a pass


def test_a_small_batch_is_measured_on_texts_as_long_as_a_large_one():
    workload = Workload(_config(), CORPUS, dynamic_dim=1)

    def mean_length(rows: int) -> float:
        texts = [t for w in range(6) for call in workload.client_calls(rows, w, 6) for t in call["TEXT"].ravel()]
        return sum(map(len, texts)) / len(texts)

    assert mean_length(8) == pytest.approx(mean_length(64), rel=0.02)
