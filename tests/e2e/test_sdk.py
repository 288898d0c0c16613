"""The official openai SDK, unchanged, against the running service."""

from __future__ import annotations

import io
import json

import numpy as np
import openai
import pytest

from tests.support.stack import as_file, assert_exactly_once, embedding_lines, read_jsonl, submit

pytestmark = pytest.mark.e2e


def test_files_roundtrip(e2e):
    client = e2e.sdk()
    lines = embedding_lines(3)
    created = client.files.create(file=as_file(lines, "mine.jsonl"), purpose="batch")
    assert created.object == "file" and created.purpose == "batch" and created.filename == "mine.jsonl"
    assert client.files.retrieve(created.id).bytes == created.bytes
    assert created.id in [f.id for f in client.files.list()]
    assert client.files.content(created.id).text.splitlines()[0] == json.dumps(lines[0])
    deleted = client.files.delete(created.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(created.id)


def test_upload_over_limit_is_413_with_a_clear_body(e2e):
    client = e2e.sdk()
    big = io.BytesIO(b'{"custom_id": "x"}\n' * (3 * 1024 * 1024 // 19))
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("big.jsonl", big), purpose="batch")
    assert caught.value.status_code == 413
    assert "limit" in caught.value.body["message"]


def test_embeddings_batch_matches_in_process_model(e2e):
    from deploy.local.inprocess import InProcessMiniLM

    client = e2e.sdk()
    lines = embedding_lines(40, seed=1)
    batch = submit(client, lines, metadata={"purpose": "sdk-test"})
    assert batch.status == "validating" and batch.metadata == {"purpose": "sdk-test"}
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    assert batch.completed_at >= batch.in_progress_at >= batch.created_at
    output, errors = assert_exactly_once(client, batch, lines)
    assert errors == []
    got = np.array([r["response"]["body"]["data"][0]["embedding"] for r in output], dtype=np.float32)
    want, _ = InProcessMiniLM().embed([line["body"]["input"] for line in lines])
    cosine = (got * want).sum(axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.9999
    usage = output[0]["response"]["body"]["usage"]
    assert usage["prompt_tokens"] > 0 and output[0]["response"]["status_code"] == 200


def test_tensor_endpoint_with_identity_model(e2e):
    client = e2e.sdk()
    lines = [
        {
            "custom_id": f"t{i}",
            "method": "POST",
            "url": "/v2/infer",
            "body": {
                "model": "identity",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 3], "data": [i, 1, 2, 3, 4, 5]}],
            },
        }
        for i in range(20)
    ]
    batch = submit(client, lines, endpoint="/v2/infer")
    batch = e2e.wait_status(client, batch.id, {"completed", "failed"})
    output, _ = assert_exactly_once(client, batch, lines)
    assert output[7]["response"]["body"]["outputs"][0] == {
        "name": "OUTPUT0",
        "datatype": "FP32",
        "shape": [2, 3],
        "data": [7.0, 1.0, 2.0, 3.0, 4.0, 5.0],
    }


def test_list_pagination_and_errors(e2e):
    client = e2e.sdk()
    ids = [submit(client, embedding_lines(2, seed=i)).id for i in range(3)]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    rest = client.batches.list(limit=2, after=page.data[-1].id)
    assert rest.data[0].id == ids[0]
    assert len(list(client.batches.list(limit=2))) >= 3  # the SDK's auto-pagination follows has_more

    done = e2e.wait_status(client, ids[0], {"completed"})
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(done.id)
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.create(input_file_id=done.input_file_id, endpoint="/v1/embeddings", completion_window="2h")
    assert "completion_window" in bad.value.body["message"]


def test_other_tenants_ids_are_404_and_bad_keys_401(e2e):
    client = e2e.sdk()
    batch = submit(client, embedding_lines(2))
    stranger = e2e.sdk(e2e.new_tenant("stranger"))
    with pytest.raises(openai.NotFoundError):
        stranger.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        stranger.files.content(batch.input_file_id)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.create(input_file_id=batch.input_file_id, endpoint="/v1/embeddings", completion_window="24h")
    assert batch.id not in [b.id for b in stranger.batches.list()]
    with pytest.raises(openai.AuthenticationError):
        e2e.sdk("sk-cp-not-a-key").batches.list()


def test_invalid_file_fails_batch_with_line_numbers(e2e):
    client = e2e.sdk()
    good = embedding_lines(2)
    raw = (
        b"\n".join(
            [
                json.dumps(good[0]).encode(),
                b"{not json",
                json.dumps({**good[1], "custom_id": good[0]["custom_id"]}).encode(),
                json.dumps({**good[1], "custom_id": "m", "body": {"model": "no-such-model", "input": "x"}}).encode(),
                b"[1, 2]",
            ]
        )
        + b"\n"
    )
    uploaded = client.files.create(file=("bad.jsonl", io.BytesIO(raw)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    batch = e2e.wait_status(client, batch.id, {"failed", "completed"})
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [
        (2, "invalid_json"),
        (3, "duplicate_custom_id"),
        (4, "model_not_found"),
        (5, "invalid_request"),
    ]
    assert batch.output_file_id is None and read_jsonl(client, batch.error_file_id) == []


def test_a_body_invalid_line_is_a_400_in_the_error_file_and_the_batch_runs_on(e2e):
    # OpenAI's per-line semantics: the envelope is valid, the embeddings body has no input.
    client = e2e.sdk()
    lines = embedding_lines(6, seed=3)
    lines[2] = {**lines[2], "body": {"model": lines[2]["body"]["model"]}}
    batch = e2e.wait_status(client, submit(client, lines).id, {"completed", "failed"})
    assert batch.status == "completed", batch.errors
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (6, 5, 1)
    output, errors = assert_exactly_once(client, batch, lines)
    assert [r["response"]["status_code"] for r in output] == [200] * 5
    [refused] = errors
    assert refused["custom_id"] == lines[2]["custom_id"] and refused["error"] is None
    assert refused["id"].startswith("batch_req_") and refused["response"]["status_code"] == 400
    assert refused["response"]["request_id"]
    error = refused["response"]["body"]["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "body.input", "invalid_input")
    assert "body.input" in error["message"]


def test_models_list_and_retrieve(e2e):
    client = e2e.sdk()
    listed = {m.id: m for m in client.models.list()}
    assert {"all-MiniLM-L6-v2", "identity"} <= set(listed)
    minilm = client.models.retrieve("all-MiniLM-L6-v2")
    assert (minilm.object, minilm.owned_by, minilm.endpoint, minilm.embedding_dimensions) == (
        "model",
        "system",
        "/v1/embeddings",
        384,
    )
    assert minilm.created > 0
    identity = listed["identity"]
    assert identity.endpoint == "/v2/infer" and identity.inputs[0]["name"] == "INPUT0"
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"
