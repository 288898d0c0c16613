"""Shard columns (kinds/tensors/columns.py): the arrays validation keeps of a tensor shard's lines give exactly the
calls the shard's own lines would have given, a shard runs from them to the same output, and anything
unusable (a line the fast lane left to the checked parse, mixed value types, named outputs, a damaged blob)
means the lines are parsed as before."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from controlplane.batches import services
from controlplane.batches.intake import verdict
from controlplane.batches.intake.quickcheck import FastLane
from controlplane.batches.intake.requests import ModelResolver
from controlplane.batches.intake.validation import BatchColumns
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.results.retention import parts_collect
from controlplane.batches.run import execution
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_open, blob_save, blob_storage
from controlplane.files.storage_gc import orphans_collect
from controlplane.kinds.base import LineIssue
from controlplane.kinds.registry import kind_for
from controlplane.kinds.tensors import columns as columns_module
from controlplane.kinds.tensors.columns import (
    ColumnsUnusable,
    ShardColumns,
    columns_decode,
    columns_encode,
)
from controlplane.kinds.tensors.packing import pack_tensors
from controlplane.kinds.tensors.values import KSERVE_DTYPES
from tests.kinds.test_tensors_fastparse import DTYPES, _assert_same_arrays, _model, _values
from tests.support.batches import jsonl, parse_accepted, tensor_line, upload
from tests.support.fakes import FakeBackend
from tests.support.running import run_shard

OUTPUTS = ["Y", "Z"]


@st.composite
def shards(draw):
    """Lines of one model that mostly share their shapes (so that many shards get columns), with the odd
    named output, mixed value types or a line that only the checked parse takes."""
    datatype = draw(st.sampled_from([d for d in DTYPES if d != "BOOL"]))  # BOOL is the checked parse's alone
    width = draw(st.integers(1, 4))
    b_width = draw(st.integers(1, 3))
    model = _model(datatype, width)
    values = _lane_values(datatype, draw(st.sampled_from(["one type"] * 4 + ["mixed", "any"])))
    raws = []
    for number in range(draw(st.integers(1, 8))):
        rows = draw(st.integers(1, 3))
        a = draw(st.lists(values, min_size=rows * width, max_size=rows * width))
        lines_b = b_width if draw(st.integers(0, 39)) else draw(st.integers(0, 3))  # now and then other dims
        b = draw(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=rows * lines_b, max_size=rows * lines_b))
        inputs = [
            {"name": "A", "datatype": datatype, "shape": [rows, width], "data": a},
            {"name": "B", "datatype": "FP32", "shape": [rows, lines_b], "data": b},
        ]
        body = {"model": model.name, "inputs": draw(st.permutations(inputs))}
        if not draw(st.integers(0, 39)):
            body["outputs"] = [{"name": "Z"}]
        line = {"custom_id": f"c{number}", "method": "POST", "url": "/v2/infer", "body": body}
        raws.append(json.dumps(line).encode() + (b"" if draw(st.integers(0, 49)) else b"\r"))  # \r: checked parse
    return model, raws


def _lane_values(datatype: str, mix: str) -> st.SearchStrategy:
    """Values the fast lane takes (so that many shards get columns): one Python type per shard, or ints and
    floats mixed (cast line by line: no columns), or anything the checked parse takes ("any")."""
    if mix == "any":
        return _values(datatype)
    if datatype.startswith(("INT", "UINT")):
        info = np.iinfo(KSERVE_DTYPES[datatype])
        return st.integers(int(info.min), min(int(info.max), 2**63 - 1))
    limit = min(float(np.finfo(KSERVE_DTYPES[datatype]).max), 1e18)
    floats = st.floats(-limit, limit, allow_nan=False, allow_infinity=False)
    return st.one_of(floats, st.integers(-1000, 1000)) if mix == "mixed" else floats


def _collect(model, raws):
    """What validation does with a shard's lines: the fast lane's accepted bodies go to the collector, any
    other accepted line spoils its columns. Returns the checked lines and the columns blob (or None)."""
    saved: dict[str, bytes] = {}
    collector = BatchColumns(
        kind=kind_for("/v2/infer"),
        batch_id="b",
        attempt=1,
        save=lambda name, f: saved.__setitem__(name, f.read()),
        delete=saved.pop,
    )(model)
    assert collector is not None
    lane = FastLane(endpoint="/v2/infer", model=model)
    checked = {}
    for number, raw in enumerate(raws, start=1):
        try:
            checked[number] = parse_accepted(raw, endpoint="/v2/infer", resolver=ModelResolver(model))
        except LineIssue:
            continue
        facts = lane.check(raw)
        if facts is not None:
            collector.add(number, facts.custom_id, lane.body)
        else:
            collector.spoil()
    name = collector.close(index=0, request_count=len(checked))
    return checked, (saved[name] if name else None)


@settings(max_examples=400, deadline=None)
@given(shards())
def test_calls_from_columns_equal_calls_from_checked_lines(case):
    model, raws = case
    checked, blob = _collect(model, raws)
    event("columns" if blob is not None else "no columns: the lines are parsed at run time")
    if blob is None:
        return
    columns = columns_decode(blob)
    assert columns.numbers == sorted(checked)
    assert columns.custom_ids == [checked[n].custom_id for n in sorted(checked)]
    got = columns.calls(model.max_batch_size, OUTPUTS)
    want = pack_tensors(checked, model.max_batch_size)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.members == b.members and a.output_names == b.output_names
        assert list(a.inputs) == list(b.inputs)
        _assert_same_arrays(a.inputs.values(), b.inputs.values())


def _line(number: int, value, *, b_width: int = 1, **extra) -> bytes:
    body = {
        "model": "m-int64",
        "inputs": [
            {"name": "A", "datatype": "INT64", "shape": [1, 1], "data": [value]},
            {"name": "B", "datatype": "FP32", "shape": [1, b_width], "data": [0.5] * b_width},
        ],
        **extra,
    }
    return json.dumps({"custom_id": f"c{number}", "method": "POST", "url": "/v2/infer", "body": body}).encode()


@pytest.mark.parametrize(
    ("raws", "why"),
    [
        ([_line(1, 2**62 + 1), _line(2, 3.0)], "an int past 2**53 beside a float: cast line by line"),
        ([_line(1, 1), _line(2, 2, outputs=[{"name": "Z"}])], "named outputs"),
        ([_line(1, 1), _line(2, 2, b_width=2)], "other dims on a -1 input"),
        ([_line(1, 1), b"\xef\xbb\xbf" + _line(2, 2)], "a line only the checked parse takes (a BOM)"),
    ],
)
def test_a_shard_the_columns_cannot_hold_exactly_gets_none(raws, why):
    checked, blob = _collect(_model("INT64", 1), raws)
    assert len(checked) == len(raws) and blob is None, why


def test_a_regular_shard_gets_columns():
    _, blob = _collect(_model("INT64", 1), [_line(n, n) for n in range(1, 6)])
    assert blob is not None and columns_decode(blob).inputs["A"][:, 0].tolist() == [1, 2, 3, 4, 5]


def test_encoding_round_trips_and_damage_is_refused():
    columns = ShardColumns(
        [3, 4, 7],
        ["a", "b\n\u00e9", "c"],
        [1, 2, 1],
        {"X": np.arange(8, dtype=np.float32).reshape(4, 2), "Y": np.array([1, 2, 3, 4], dtype=np.uint64)},
    )
    data = columns_encode(columns)
    back = columns_decode(data)
    assert back.numbers == columns.numbers and back.custom_ids == columns.custom_ids and back.rows == columns.rows
    for name, array in columns.inputs.items():
        assert back.inputs[name].dtype == array.dtype and np.array_equal(back.inputs[name], array)
    for damaged in (data[:-1], data + b"x", b"JUNK" + data[4:], data[:20], b""):
        with pytest.raises(ColumnsUnusable):
            columns_decode(damaged)


# -- through validation and a shard's run, on the database -----------------------------------------------


@pytest.fixture
def quiet(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4
    settings.BATCH_EARLY_DISPATCH = False


def _validated(tenant, lines) -> Batch:
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint="/v2/infer", completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def _run_all(batch: Batch) -> list[str]:
    backend = FakeBackend()
    for shard in Shard.objects.filter(batch=batch).order_by("index"):
        assert run_shard(shard, backend, owner="w") == "succeeded"
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    with blob_open(File.objects.get(id=batch.output_file_id).storage_name) as fh:
        return [line.decode() for line in fh]


def _lines(n: int) -> list[dict]:
    lines = [tensor_line(f"r-{i}", [[float(i), 1.5, -2.0]]) for i in range(n)]
    lines[4] = tensor_line("r-4", [[4.0, 1.5, -2.0], [5.0, 6.0, 7.0]])  # two rows on one line
    return lines


@pytest.mark.django_db(transaction=True)
def test_shards_run_from_their_columns_to_the_output_their_lines_give(tenant, quiet, settings, monkeypatch):
    with_columns = _validated(tenant, _lines(10))
    shards = list(Shard.objects.filter(batch=with_columns).order_by("index"))
    assert len(shards) == 3 and all(s.columns_name for s in shards)
    assert all(blob_storage().exists(s.columns_name) for s in shards)

    def no_parsing(shard, kind):
        raise AssertionError("a shard with columns parsed its lines")

    monkeypatch.setattr(execution, "_read_shard", no_parsing)
    from_columns = _run_all(with_columns)
    monkeypatch.undo()
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)

    settings.BATCH_SHARD_COLUMNS = False
    parsed = _validated(tenant, _lines(10))
    assert not Shard.objects.filter(batch=parsed).exclude(columns_name="").exists()
    from_lines = _run_all(parsed)
    # The same lines, ids and values; only the request ids (hashed from the batch id) differ.
    assert [_without_ids(line) for line in from_columns] == [_without_ids(line) for line in from_lines]


def _without_ids(line: str) -> dict:
    record = json.loads(line)
    record.pop("id")
    record["response"].pop("request_id")
    return record


@pytest.mark.django_db(transaction=True)
def test_a_damaged_or_missing_columns_blob_means_the_lines_are_parsed(tenant, quiet, caplog):
    batch = _validated(tenant, _lines(10))
    first, second, third = Shard.objects.filter(batch=batch).order_by("index")
    storage = blob_storage()
    storage.delete(first.columns_name)
    blob_save(first.columns_name, io.BytesIO(b"CPCOLS1\n{not json"))
    storage.delete(second.columns_name)
    # The third's columns are whole but hold 1 line where the shard has 2.
    kept = columns_decode(storage.open(third.columns_name).read())
    storage.delete(third.columns_name)
    one = ShardColumns(kept.numbers[:1], kept.custom_ids[:1], kept.rows[:1], {k: v[:1] for k, v in kept.inputs.items()})
    blob_save(third.columns_name, io.BytesIO(columns_encode(one)))
    out = [json.loads(line) for line in _run_all(batch)]
    assert [r["custom_id"] for r in out] == [f"r-{i}" for i in range(10)]
    assert out[4]["response"]["body"]["outputs"][0]["data"] == [4.0, 1.5, -2.0, 5.0, 6.0, 7.0]
    assert caplog.text.count("parsing its lines") == 3


@pytest.mark.django_db(transaction=True)
def test_columns_of_a_file_that_fails_validation_are_deleted(tenant, quiet):
    # An envelope error (the method) fails the batch; a refused body alone would not.
    lines = [*_lines(9), {"custom_id": "bad", "method": "GET", "url": "/v2/infer", "body": {"model": "identity"}}]
    batch = _validated(tenant, lines)
    assert batch.status == BatchStatus.FAILED
    assert not [name for name in blob_storage().listdir(f"parts/{batch.id}")[1] if ".columns" in name]


@pytest.mark.django_db(transaction=True)
def test_a_shard_with_a_refused_line_runs_its_lines_checked_and_answers_that_line_with_a_400(tenant, quiet):
    lines = _lines(10)
    # The shape needs three values and the data has one: the unchecked fast parse would take it as it is,
    # so the shard must parse its lines with the checked parse, which refuses it as validation did.
    lines[5]["body"]["inputs"][0].update(shape=[1, 3], data=[1.0])
    batch = _validated(tenant, lines)
    assert batch.status == BatchStatus.IN_PROGRESS
    shards = list(Shard.objects.filter(batch=batch).order_by("index"))
    assert [(s.body_errors, bool(s.columns_name)) for s in shards] == [(0, True), (1, False), (0, True)]
    backend = FakeBackend()
    for shard in shards:
        assert run_shard(shard, backend, owner="w") == "succeeded"
    batch.refresh_from_db()
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.COMPLETED, 9, 1)
    with blob_open(File.objects.get(id=batch.error_file_id).storage_name) as fh:
        [refused] = [json.loads(line) for line in fh.read().splitlines()]
    assert refused["custom_id"] == "r-5" and refused["error"] is None
    assert refused["response"]["status_code"] == 400
    error = refused["response"]["body"]["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_data",
        "body.inputs[0].data",
    )


@pytest.mark.django_db(transaction=True)
def test_the_collector_keeps_live_columns_and_deletes_those_of_ended_batches(tenant, quiet, settings):
    from datetime import timedelta

    from django.utils import timezone

    batch = _validated(tenant, _lines(10))
    names = list(Shard.objects.filter(batch=batch).values_list("columns_name", flat=True))
    later = timezone.now() + timedelta(seconds=settings.STORAGE_GC_GRACE_SECONDS + 60)
    assert not set(orphans_collect(now=later)) & set(names)  # named by their shards: not orphans
    _run_all(batch)
    Batch.objects.filter(id=batch.id).update(completed_at=timezone.now() - timedelta(days=1))
    assert parts_collect(now=later) >= len(names)
    assert not any(blob_storage().exists(name) for name in names)
    assert not Shard.objects.filter(batch=batch).exclude(columns_name="").exists()


def test_columns_names_carry_the_validation_attempt():
    assert columns_module.columns_name("batch_x", 3, 2) == "parts/batch_x/000003.columns2.bin"


@pytest.mark.django_db(transaction=True)
def test_a_file_with_an_error_writes_no_columns_after_it(tenant, quiet, monkeypatch):
    saved = []

    def counting_save(name, content):
        saved.append(name)
        return blob_save(name, content)

    monkeypatch.setattr(verdict, "blob_save", counting_save)
    bad = {"custom_id": "bad", "method": "GET", "url": "/v2/infer", "body": {"model": "identity"}}  # envelope
    batch = _validated(tenant, [*_lines(20)[:4], bad, *_lines(20)[5:]])  # one good shard, then the error
    assert batch.status == BatchStatus.FAILED
    assert [name.rsplit("/", 1)[1] for name in saved] == ["000000.columns1.bin"]  # the shard before the error only
