"""Generation shard columns (kinds/generation/columns.py): validation keeps each shard's lines as it parsed them,
the shard's run uses them instead of applying the chat template and tokenizer again, and a shard without
usable columns (validated before they existed, a blob missing or damaged) parses its lines as before."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_open, blob_save, blob_storage
from controlplane.kinds.base import ParsedLine
from controlplane.kinds.generation import kind as generation
from controlplane.kinds.generation.columns import generation_columns_decode, generation_columns_encode
from controlplane.kinds.registry import kind_for
from tests.kinds.fake_engine import FakeEngine
from tests.kinds.test_generation_kind import CHAT, COMPLETIONS, chat, parsed_lines, tinylm
from tests.support.batches import jsonl, upload
from tests.support.running import run_shard

SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "count",
        "strict": True,
        "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    },
}


def _comparable(lines: dict[int, ParsedLine]) -> dict[int, Any]:
    """BodyIssue is an exception (compared by identity): its fields stand for it."""
    return {
        number: (p.custom_id, p.model_name, p.request, p.issue and (p.issue.code, p.issue.message, p.issue.param))
        for number, p in lines.items()
    }


@pytest.mark.parametrize(
    ("url", "bodies"),
    [
        (
            CHAT,
            [
                chat("count from 1 to 3", max_tokens=10, n=2, seed=-7, stop=["5", "x"], temperature=0.5, top_p=0.9),
                chat("count from 2 to 4", logprobs=True, top_logprobs=3, metadata={"k": "v"}, user="u"),
                chat("count from 2 to 4", response_format=SCHEMA, presence_penalty=1.5, frequency_penalty=-1),
                chat("count from 1 to 3", temperature=5),  # refused: a 400 line
                {
                    **chat("x"),
                    "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "y"}],
                },
            ],
        ),
        (COMPLETIONS, [{"model": "tinylm", "prompt": "count from 1 to 3", "logprobs": 2}, {"model": "tinylm"}]),
    ],
)
def test_columns_give_back_exactly_the_lines_validation_parsed(url, bodies):
    lines = parsed_lines(url, bodies, tinylm(structured_outputs=True))
    assert any(p.issue for p in lines.values()) and any(p.request for p in lines.values())
    model_name, decoded = generation_columns_decode(generation_columns_encode("tinylm", list(lines.items())))
    assert model_name == "tinylm"
    assert _comparable(decoded) == _comparable(lines)


# -- through validation and a shard's run, on the database -----------------------------------------------


@pytest.fixture
def quiet(settings, monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    settings.SHARD_MAX_LINES = 4
    settings.BATCH_EARLY_DISPATCH = False


def _lines(n: int) -> list[dict[str, Any]]:
    lines = [
        {"custom_id": f"g-{i}", "method": "POST", "url": CHAT, "body": chat(f"count from {i} to {i + 3}", seed=i)}
        for i in range(n)
    ]
    lines[5]["body"]["temperature"] = 5  # refused at validation: the run answers it with the same 400
    return lines


def _validated(tenant, lines) -> Batch:
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint=CHAT, completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def _run_all(batch: Batch) -> tuple[FakeEngine, list[dict[str, Any]]]:
    engine = FakeEngine()
    for shard in Shard.objects.filter(batch=batch).order_by("index"):
        assert run_shard(shard, engine, owner="w") == "succeeded"
    batch.refresh_from_db()
    assert (batch.status, batch.completed_lines, batch.failed_lines) == (BatchStatus.COMPLETED, 9, 1)
    records = []
    for file_id in (batch.output_file_id, batch.error_file_id):
        with blob_open(File.objects.get(id=file_id).storage_name) as fh:
            records += [_without_ids(json.loads(line)) for line in fh]
    return engine, sorted(records, key=lambda record: int(record["custom_id"][2:]))


def _without_ids(record: dict[str, Any]) -> dict[str, Any]:
    """The request ids (hashed from the batch id) and the creation time differ between two batches."""
    record.pop("id")
    record["response"].pop("request_id")
    body = record["response"]["body"]
    for key in ("id", "created"):
        body.pop(key, None)
    return record


@pytest.mark.django_db(transaction=True)
def test_shards_run_from_their_columns_without_the_tokenizer_to_the_output_their_lines_give(
    tenant, quiet, settings, monkeypatch
):
    with_columns = _validated(tenant, _lines(10))
    shards = list(Shard.objects.filter(batch=with_columns).order_by("index"))
    assert [(s.body_errors, bool(s.columns_name)) for s in shards] == [(0, True), (1, True), (0, True)]

    def no_tokenizer(model):
        raise AssertionError("a shard with columns parsed its lines with the tokenizer")

    monkeypatch.setattr(generation, "model_tokenizer", no_tokenizer)
    engine, from_columns = _run_all(with_columns)
    monkeypatch.undo()
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)

    settings.BATCH_SHARD_COLUMNS = False  # as a shard validated before columns existed: its lines are parsed
    parsed = _validated(tenant, _lines(10))
    assert not Shard.objects.filter(batch=parsed).exclude(columns_name="").exists()
    parsed_engine, from_lines = _run_all(parsed)
    assert from_columns == from_lines
    refused = from_columns[5]["response"]
    assert (refused["status_code"], refused["body"]["error"]["param"]) == (400, "body.temperature")
    # The engine got the same prompts and sampling parameters either way.
    sent = [(r.prompt, r.sampling_parameters) for r in engine.submitted]
    assert sent == [(r.prompt, r.sampling_parameters) for r in parsed_engine.submitted] and len(sent) == 9


@pytest.mark.django_db(transaction=True)
def test_a_missing_damaged_or_foreign_columns_blob_means_the_lines_are_parsed(tenant, quiet, caplog):
    batch = _validated(tenant, _lines(10))
    first, second, third = Shard.objects.filter(batch=batch).order_by("index")
    storage = blob_storage()
    storage.delete(first.columns_name)  # e.g. lost, or never written
    storage.delete(second.columns_name)
    blob_save(second.columns_name, io.BytesIO(b"CPGENCOLS1\n{not json"))
    # The third's columns are whole but were parsed for another model.
    _, lines = generation_columns_decode(storage.open(third.columns_name).read())
    storage.delete(third.columns_name)
    blob_save(third.columns_name, io.BytesIO(generation_columns_encode("other", list(lines.items()))))
    _, records = _run_all(batch)
    assert [r["custom_id"] for r in records] == [f"g-{i}" for i in range(10)]
    assert records[0]["response"]["body"]["choices"][0]["message"]["content"] == "0 1 2 3"
    assert caplog.text.count("parsing its lines") == 3


@pytest.mark.django_db(transaction=True)
def test_a_file_that_fails_validation_keeps_no_generation_columns(tenant, quiet):
    lines = [*_lines(9), {"custom_id": "bad", "method": "GET", "url": CHAT, "body": chat("x")}]
    batch = _validated(tenant, lines)
    assert batch.status == BatchStatus.FAILED
    assert not [name for name in blob_storage().listdir(f"parts/{batch.id}")[1] if ".columns" in name]


def test_the_kind_offers_a_collector_for_generation_models():
    collector = kind_for(CHAT).columns_collector(tinylm(), batch_id="batch_x", attempt=1, save=lambda *a: None)
    assert collector is not None
    collector.add(1, "c1", chat("x"))  # a fast-lane body without its parse cannot be kept
    assert collector.close(index=0, request_count=1) == ""
