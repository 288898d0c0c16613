"""The endpoint-kind contract (kinds/base.py), held for every kind in the registry on generated bodies:

- a valid body parses to a request of at least one work unit;
- any body parses or is refused with a BodyIssue that names its param — never another exception;
- running a shard's lines (the kind's ``run``, packing included) reports every line exactly once: refused
  lines as 400 failures with their param, the others with one response body each; no call carries more
  than the model's max_batch_size rows and every piece of every line is in exactly one call;
- a finished shard's ledger units and measured work units are never negative.

A kind added to the registry without a case here fails ``test_every_registered_kind_has_a_contract_case``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import (
    BodyIssue,
    EndpointKind,
    LineFailure,
    LineOutcome,
    LineOutput,
    ParsedLine,
    TokenCounts,
)
from controlplane.kinds.calls import CallKind
from controlplane.kinds.registry import KINDS, kind_for
from tests.kinds.fake_engine import FakeEngine

# --- per-kind cases --------------------------------------------------------------------------------


def _embedding_model(max_batch_size: int) -> CatalogueModel:
    return CatalogueModel(
        name="emb",
        triton_name="emb",
        kind="embeddings",
        max_batch_size=max_batch_size,
        embedding_dimensions=8,
        inputs=[{"name": "TEXT", "datatype": "BYTES", "dims": [1]}],
        outputs=[{"name": "EMBEDDING", "datatype": "FP32", "dims": [8]}, {"name": "TOKENS", "datatype": "INT32"}],
    )


def _tensor_model(max_batch_size: int) -> CatalogueModel:
    return CatalogueModel(
        name="tens",
        triton_name="tens",
        kind="tensor",
        max_batch_size=max_batch_size,
        inputs=[{"name": "INPUT0", "datatype": "FP32", "dims": [-1]}],
        outputs=[{"name": "OUTPUT0", "datatype": "FP32", "dims": [-1]}],
    )


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
EMBEDDING_BODIES = st.fixed_dictionaries(
    {"model": st.just("emb"), "input": TEXT | st.lists(TEXT, min_size=1, max_size=5)},
    optional={"encoding_format": st.sampled_from(["float", "base64"]), "dimensions": st.just(8)},
)
# Each body is refused for one reason its kind must name: no input, a wrong type, a wrong value.
BAD_EMBEDDING_BODIES = st.one_of(
    st.just({"model": "emb"}),
    st.builds(lambda v: {"model": "emb", "input": v}, st.integers() | st.just([]) | st.just("") | st.just([1, 2])),
    st.builds(
        lambda v: {"model": "emb", "input": "x", "encoding_format": v},
        (st.text(max_size=5) | st.integers()).filter(lambda v: v not in ("float", "base64")),
    ),
    st.builds(lambda v: {"model": "emb", "input": "x", "dimensions": v}, st.integers().filter(lambda d: d != 8)),
)


@st.composite
def _tensor_body(draw: Any) -> dict[str, Any]:
    rows, width = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    data = draw(st.lists(st.floats(-1e6, 1e6, width=32), min_size=rows * width, max_size=rows * width))
    body: dict[str, Any] = {
        "model": "tens",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [rows, width], "data": data}],
    }
    if draw(st.booleans()):
        body["outputs"] = [{"name": "OUTPUT0"}]
    return body


def _break_tensor(body: dict[str, Any], how: int, value: Any) -> dict[str, Any]:
    item = dict(body["inputs"][0])
    if how == 0:
        item["shape"] = [item["shape"][0], item["shape"][1] + 1]  # the data no longer fills it
    elif how == 1:
        item["datatype"] = "INT8"
    elif how == 2:
        item["name"] = "NOPE"
    elif how == 3:
        item["data"] = [value, "x"]
    elif how == 4:
        return {"model": "tens"}  # no inputs at all
    else:
        return {**body, "outputs": [{"name": "NOPE"}]}
    return {**body, "inputs": [item]}


BAD_TENSOR_BODIES = st.builds(_break_tensor, _tensor_body(), st.integers(0, 5), st.integers())


def _embedding_outputs(call_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    count = call_inputs["TEXT"].shape[0]
    return {"EMBEDDING": np.ones((count, 8), np.float32), "TOKENS": np.full((count, 1), 3, np.int32)}


def _identity_outputs(call_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"OUTPUT0": call_inputs["INPUT0"]}


def _generation_model(max_batch_size: int) -> CatalogueModel:
    from controlplane.fleet.catalogue.seed import SEED

    return CatalogueModel(**{**next(e for e in SEED if e["name"] == "tinylm"), "max_batch_size": max_batch_size})


WORDS = st.lists(
    st.sampled_from(["count", "from", "to", "3", "17", "please", "answer", "zebra"]), min_size=1, max_size=12
)
_SAMPLING = {
    "max_tokens": st.integers(1, 64),
    "temperature": st.floats(0, 2),
    "n": st.integers(1, 8),
    "seed": st.integers(-(2**63), 2**63 - 1),
    "stop": st.sampled_from(["5", ["5", "9"]]),
}
CHAT_BODIES = st.fixed_dictionaries(
    {
        "model": st.just("tinylm"),
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": WORDS.map(" ".join)}),
            min_size=1,
            max_size=3,
        ),
    },
    optional=_SAMPLING,
)
COMPLETION_BODIES = st.fixed_dictionaries(
    {"model": st.just("tinylm"), "prompt": WORDS.map(" ".join)}, optional={**_SAMPLING, "logprobs": st.integers(0, 5)}
)
# Each refused for one reason: a value out of range, no messages/prompt, a field the service does not honour.
BAD_GENERATION_FIELDS = st.sampled_from(
    [{"temperature": 2.5}, {"n": 9}, {"max_tokens": 0}, {"max_tokens": 10_000}, {"stream": True}, {"top_p": 0}]
)
BAD_CHAT_BODIES = st.one_of(
    st.builds(lambda body, bad: {**body, **bad}, CHAT_BODIES, BAD_GENERATION_FIELDS),
    st.just({"model": "tinylm", "messages": []}),
    st.just({"model": "tinylm", "messages": [{"role": "wizard", "content": "x"}]}),
)
BAD_COMPLETION_BODIES = st.one_of(
    st.builds(lambda body, bad: {**body, **bad}, COMPLETION_BODIES, BAD_GENERATION_FIELDS),
    st.just({"model": "tinylm"}),
    st.just({"model": "tinylm", "prompt": [1, 2, 3]}),
)

RESPONSES_BODIES = st.fixed_dictionaries(
    {
        "model": st.just("tinylm"),
        "input": WORDS.map(" ".join)
        | st.lists(
            st.fixed_dictionaries(
                {"role": st.sampled_from(["developer", "user", "assistant"]), "content": WORDS.map(" ".join)}
            ),
            min_size=1,
            max_size=3,
        ),
    },
    optional={
        "instructions": WORDS.map(" ".join),
        "max_output_tokens": st.integers(16, 64),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.1, 1),
    },
)
BAD_RESPONSES_BODIES = st.one_of(
    st.builds(
        lambda body, bad: {**body, **bad},
        RESPONSES_BODIES,
        st.sampled_from(
            [
                {"temperature": 2.5},
                {"max_output_tokens": 15},
                {"max_output_tokens": 10_000},
                {"stream": True},
                {"store": True},
                {"previous_response_id": "resp_1"},
                {"tools": [{"type": "web_search"}]},
            ]
        ),
    ),
    st.just({"model": "tinylm", "input": []}),
    st.just({"model": "tinylm", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
)


@dataclass(frozen=True)
class KindCase:
    model: Any  # max_batch_size → CatalogueModel
    bodies: st.SearchStrategy[dict[str, Any]]
    bad_bodies: st.SearchStrategy[dict[str, Any]]
    respond: Any  # a call's inputs → the outputs a model of this kind answers


CASES = {
    "/v1/embeddings": KindCase(_embedding_model, EMBEDDING_BODIES, BAD_EMBEDDING_BODIES, _embedding_outputs),
    "/v2/infer": KindCase(_tensor_model, _tensor_body(), BAD_TENSOR_BODIES, _identity_outputs),
    # Generation answers over a stream (the backend's generation_stream), from tests/kinds/fake_engine.py.
    "/v1/chat/completions": KindCase(_generation_model, CHAT_BODIES, BAD_CHAT_BODIES, None),
    "/v1/completions": KindCase(_generation_model, COMPLETION_BODIES, BAD_COMPLETION_BODIES, None),
    "/v1/responses": KindCase(_generation_model, RESPONSES_BODIES, BAD_RESPONSES_BODIES, None),
}
URLS = sorted(CASES)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_every_registered_kind_has_a_contract_case():
    assert sorted(KINDS) == URLS
    for url, kind in KINDS.items():
        assert kind.url == url and isinstance(kind, EndpointKind)


# --- (a) validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("url", URLS)
@FAST
@given(data=st.data())
def test_a_valid_body_is_a_request_of_at_least_one_work_unit(url, data):
    kind, case = kind_for(url), CASES[url]
    request = kind.parse_body(data.draw(case.bodies), model=case.model(8))
    assert kind.work_units(request) >= 1


@pytest.mark.parametrize("url", URLS)
@FAST
@given(data=st.data())
def test_an_invalid_body_is_a_body_issue_that_names_its_param(url, data):
    kind, case = kind_for(url), CASES[url]
    with pytest.raises(BodyIssue) as refused:
        kind.parse_body(data.draw(case.bad_bodies), model=case.model(8))
    assert refused.value.param and refused.value.param.startswith("body.")
    assert refused.value.code and refused.value.message


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.parametrize("url", URLS)
@FAST
@given(data=st.data())
def test_any_body_parses_or_is_refused_never_raises_anything_else(url, data):
    kind, case = kind_for(url), CASES[url]
    body = dict(data.draw(case.bodies))
    key = data.draw(st.sampled_from(sorted(body)))
    body[key] = data.draw(JSON)  # one field replaced by any JSON value (possibly still valid)
    try:
        request = kind.parse_body(body, model=case.model(8))
    except BodyIssue as issue:
        assert issue.param
    else:
        assert kind.work_units(request) >= 1


# --- (b) + (c) running: every line once, calls within max_batch_size ------------------------------


class _Backend:
    server = "fake"
    instances = None
    gpus = False

    def __init__(self, respond: Any, max_batch_size: int) -> None:
        self.respond, self.max_batch_size = respond, max_batch_size
        self.calls: list[dict[str, np.ndarray]] = []

    def prepare(self, triton_model: str) -> None:
        return None

    def infer(self, triton_model: str, inputs: dict[str, np.ndarray], output_names: list[str]) -> dict[str, Any]:
        rows = {array.shape[0] for array in inputs.values()}
        assert len(rows) == 1 and 1 <= rows.pop() <= self.max_batch_size
        self.calls.append(inputs)
        return self.respond(inputs)

    def generation_stream(self, triton_model: str, *, on_response: Any) -> Any:
        return FakeEngine().generation_stream(triton_model, on_response=on_response)


class _Control:
    def __init__(self) -> None:
        self.finished: dict[int, LineOutcome] = {}

    def check(self) -> bool:
        return False

    def finish(self, number: int, outcome: LineOutcome) -> None:
        assert number not in self.finished, f"line {number} reported twice"
        self.finished[number] = outcome

    def request_id(self, number: int) -> str:
        return f"request-{number}"


@pytest.mark.parametrize("url", URLS)
@FAST
@given(data=st.data())
def test_running_a_shard_reports_every_line_once_in_calls_within_max_batch_size(url, data):
    kind, case = kind_for(url), CASES[url]
    max_batch_size = data.draw(st.integers(4, 16), label="max_batch_size")
    model = case.model(max_batch_size)
    bodies = data.draw(st.lists(case.bodies | case.bad_bodies, min_size=1, max_size=25))
    lines: dict[int, ParsedLine] = {}
    for number, body in enumerate(bodies, start=1):
        try:
            lines[number] = ParsedLine(f"c{number}", model.name, kind.parse_body(body, model=model))
        except BodyIssue as issue:
            lines[number] = ParsedLine(f"c{number}", model.name, None, issue)
    if isinstance(kind, CallKind):  # a request/response kind: every piece of every line in one call
        runnable = {n: p for n, p in lines.items() if p.issue is None}
        calls = kind.pack(
            runnable,
            max_batch_size=max_batch_size,
            min_calls=data.draw(st.integers(1, 4)),
            equal_cost=data.draw(st.booleans()),
        )
        pieces = [(m.line, m.slot) for call in calls for m in call.members]
        assert len(pieces) == len(set(pieces)) and {line for line, _ in pieces} == set(runnable)
        assert all(sum(m.rows for m in call.members) <= max_batch_size for call in calls)

    backend, control = _Backend(case.respond, max_batch_size), _Control()
    stopped = kind.run(lines, model=model, backend=backend, control=control, inflight=2)
    assert not stopped and sorted(control.finished) == sorted(lines)
    for number, outcome in control.finished.items():
        if lines[number].issue is not None:
            assert isinstance(outcome, LineFailure) and outcome.status_code == 400 and outcome.param
        else:
            assert isinstance(outcome, LineOutput) and isinstance(outcome.body, dict) and outcome.tokens >= 0


# --- (d) usage -------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", URLS)
@given(
    completed=st.integers(0, 100),
    refused=st.integers(0, 100),
    estimated=st.integers(0, 10**6),
    measured=st.integers(0, 10**6),
)
def test_ledger_and_measured_units_are_never_negative(url, completed, refused, estimated, measured):
    kind = kind_for(url)
    counts = TokenCounts(input=measured, output=measured // 3, cached=measured // 2, choices=completed)
    billed = kind.ledger_units(
        completed=completed, runnable=completed + refused, estimated_work_units=estimated, measured=counts
    )
    assert billed.tokens >= 0 and billed.rows >= 0 and billed.output_tokens >= 0
    assert 0 <= billed.cached_tokens <= billed.tokens
    assert kind.measured_work_units(estimated=estimated, measured=counts, model=None) >= 0
