"""Every envelope problem fails validation with its line number and a message saying what to fix; a line whose
envelope is valid but whose body its endpoint kind refuses is planned with its shard instead (a 400 line in
the error file when the shard runs, as on OpenAI)."""

from __future__ import annotations

import io
import json

import pytest

from controlplane.batches.intake.requests import ModelResolver, parse_line
from controlplane.batches.intake.validation import validate_input
from tests.support.batches import embedding_line, jsonl, tensor_line

pytestmark = pytest.mark.django_db


def _validate(content: bytes, endpoint: str = "/v1/embeddings", **kw):
    options = {"max_line_bytes": 4096, "max_lines": 1000, "shard_lines": 3} | kw
    return validate_input(io.BytesIO(content), endpoint=endpoint, **options)


def _codes(result) -> list[tuple[int | None, str]]:
    return [(e["line"], e["code"]) for e in result.errors]


def _refused(content: bytes, endpoint: str = "/v1/embeddings") -> list[tuple[int, str, str]]:
    """(line, code, message) of each line whose body the kind refuses (the shard's run writes these)."""
    resolver = ModelResolver()
    found = []
    for number, raw in enumerate(content.splitlines(), start=1):
        issue = parse_line(raw, endpoint=endpoint, resolver=resolver).issue
        if issue is not None:
            assert issue.param and issue.param.startswith("body.")
            found.append((number, issue.code, issue.message))
    return found


def test_valid_file_plans_contiguous_shards_with_byte_ranges(catalogue):
    lines = [embedding_line(f"r{i}", f"text {i}") for i in range(7)]
    content = jsonl(lines[:3]) + b"\n" + jsonl(lines[3:])  # a blank line is skipped, not an error
    result = _validate(content)
    assert result.ok and result.total == 7 and result.model == "all-MiniLM-L6-v2"
    assert [(s.start_line, s.end_line, s.request_count) for s in result.shards] == [(1, 3, 3), (5, 7, 3), (8, 8, 1)]
    for shard in result.shards:
        first = content[shard.start_byte : shard.end_byte].split(b"\n")[0]
        assert json.loads(first)["custom_id"] == lines[shard.start_line - 1 - (shard.start_line > 4)]["custom_id"]
    assert result.shards[-1].end_byte == len(content)


def test_a_shard_closes_once_it_holds_shard_bytes_of_input(catalogue):
    lines = [embedding_line(f"r{i}", "x" * (100 if i % 3 else 1000)) for i in range(9)]
    content = jsonl(lines)
    result = _validate(content, shard_lines=100, shard_bytes=1000)
    # Lines 1, 4 and 7 are the long ones: each brings its shard past 1,000 bytes and closes it.
    assert [(s.start_line, s.end_line) for s in result.shards] == [(1, 1), (2, 4), (5, 7), (8, 9)]
    assert [s.start_byte for s in result.shards[1:]] == [s.end_byte for s in result.shards[:-1]]


@pytest.mark.parametrize(
    ("bad", "code", "needle"),
    [
        (b"{not json", "invalid_json", "not valid JSON"),
        (b"[1, 2]", "invalid_request", "JSON object"),
        (
            json.dumps({"method": "POST", "url": "/v1/embeddings", "body": {}}).encode(),
            "missing_custom_id",
            "custom_id",
        ),
        (json.dumps({**embedding_line("x", "t"), "method": "GET"}).encode(), "invalid_method", "POST"),
        (
            json.dumps({**embedding_line("x", "t"), "url": "/v1/chat/completions"}).encode(),
            "mismatched_url",
            "/v1/embeddings",
        ),
        (json.dumps(embedding_line("x", "t", model="gpt-7")).encode(), "model_not_found", "gpt-7"),
        (json.dumps(embedding_line("x", "t", model="identity")).encode(), "invalid_model", "/v1/embeddings"),
        (json.dumps({**embedding_line("x", "t"), "body": "text"}).encode(), "invalid_body", "object"),
    ],
)
def test_bad_line_is_reported_with_its_line_number(catalogue, bad, code, needle):
    content = jsonl([embedding_line("ok-1", "fine"), bad, embedding_line("ok-2", "fine")])
    result = _validate(content)
    assert not result.ok
    assert _codes(result) == [(2, code)]
    assert needle in result.errors[0]["message"]


@pytest.mark.parametrize(
    ("bad", "code", "needle"),
    [
        (embedding_line("x", [1, 2, 3]), "invalid_input", "token arrays"),
        (embedding_line("x", 42), "invalid_input", "string"),
        (embedding_line("x", ""), "invalid_input", "empty"),
        (embedding_line("x", "t", dimensions=128), "invalid_value", "384"),
        ({**embedding_line("x", "t"), "body": {"model": "all-MiniLM-L6-v2"}}, "invalid_input", "body.input"),
    ],
)
def test_a_refused_body_is_planned_as_a_400_line_not_a_batch_error(catalogue, bad, code, needle):
    content = jsonl([embedding_line("ok-1", "fine"), bad, embedding_line("ok-2", "fine")])
    result = _validate(content)
    assert result.ok and result.total == 3 and result.body_errors == 1
    assert [(s.request_count, s.body_errors) for s in result.shards] == [(3, 1)]
    # The refused line costs no work units: only the two valid lines' estimate is planned.
    assert result.work_units == result.shards[0].work_units == 2 * (len("fine") // 4 + 2)
    [(line, refused_code, message)] = _refused(content)
    assert (line, refused_code) == (2, code) and needle in message


def test_a_refused_line_still_counts_for_duplicate_ids_and_mixed_models(catalogue):
    from controlplane.fleet.models import CatalogueModel

    CatalogueModel.objects.create(
        name="other-embedder", triton_name="other", kind="embeddings", max_batch_size=8, embedding_dimensions=384
    )
    refused_dup = embedding_line("a", "")  # a valid envelope, a refused body, and a duplicate id
    refused_mixed = embedding_line("c", "", model="other-embedder")
    result = _validate(jsonl([embedding_line("a", "x"), refused_dup, refused_mixed]))
    assert _codes(result) == [(2, "duplicate_custom_id"), (3, "mixed_models")]


def test_duplicate_custom_id_names_the_first_line(catalogue):
    result = _validate(jsonl([embedding_line("a", "x"), embedding_line("b", "y"), embedding_line("a", "z")]))
    assert _codes(result) == [(3, "duplicate_custom_id")]
    assert "line 1" in result.errors[0]["message"]


def test_duplicates_are_reported_in_line_order_among_other_errors_and_counted(catalogue):
    lines = [
        embedding_line("a", "x"),  # 1
        b"{bad",  # 2
        embedding_line("b", "y"),  # 3
        embedding_line("a", "z"),  # 4: duplicate of 1
        b"{bad",  # 5
        embedding_line("b", "w"),  # 6: duplicate of 3
        embedding_line("a", "v"),  # 7: duplicate of 1 again
    ]
    result = _validate(jsonl(lines))
    assert _codes(result) == [
        (2, "invalid_json"),
        (4, "duplicate_custom_id"),
        (5, "invalid_json"),
        (6, "duplicate_custom_id"),
        (7, "duplicate_custom_id"),
    ]
    assert result.error_count == 5
    assert [
        "custom_id 'a' is also used on line 1" in result.errors[1]["message"],
        "line 3" in result.errors[3]["message"],
    ] == [True, True]
    assert "line 1" in result.errors[4]["message"]


def test_a_duplicate_line_naming_another_model_gets_only_its_duplicate_error(catalogue):
    from controlplane.fleet.models import CatalogueModel

    CatalogueModel.objects.create(
        name="other-embedder", triton_name="other", kind="embeddings", max_batch_size=8, embedding_dimensions=384
    )
    lines = [
        embedding_line("a", "x"),
        embedding_line("a", "y", model="other-embedder"),  # duplicate and mixed: the duplicate is what it is told
        embedding_line("c", "y", model="other-embedder"),  # mixed only
    ]
    result = _validate(jsonl(lines))
    assert _codes(result) == [(2, "duplicate_custom_id"), (3, "mixed_models")]
    assert result.error_count == 2


def test_many_duplicates_are_counted_and_the_first_listed(catalogue):
    lines = [embedding_line(f"id-{i % 10}", "x") for i in range(400)]
    result = _validate(jsonl(lines), max_lines=1000)
    assert result.error_count == 390
    assert [e["line"] for e in result.errors] == list(range(11, 111))


def test_mixed_models_are_rejected(catalogue):
    from controlplane.fleet.models import CatalogueModel

    CatalogueModel.objects.create(
        name="other-embedder", triton_name="other", kind="embeddings", max_batch_size=8, embedding_dimensions=384
    )
    result = _validate(jsonl([embedding_line("a", "x"), embedding_line("b", "y", model="other-embedder")]))
    assert _codes(result) == [(2, "mixed_models")]


def test_empty_file_and_blank_only_file(catalogue):
    assert _codes(_validate(b"")) == [(None, "empty_file")]
    assert _codes(_validate(b"\n  \n")) == [(None, "empty_file")]


def test_too_long_line_is_skipped_in_bounded_memory(catalogue):
    long_line = json.dumps(embedding_line("big", "word " * 5000)).encode()
    result = _validate(jsonl([embedding_line("a", "x"), long_line, embedding_line("c", "y")]), max_line_bytes=1024)
    assert _codes(result) == [(2, "line_too_long")]


def test_too_many_lines(catalogue):
    result = _validate(jsonl([embedding_line(f"r{i}", "x") for i in range(5)]), max_lines=3)
    assert _codes(result) == [(4, "too_many_requests")]


def test_error_list_is_capped_but_counted(catalogue):
    result = _validate(b"{bad\n" * 150)
    assert len(result.errors) == 100 and result.error_count == 150


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda b: b["inputs"][0].update(name="INPUT9"), "invalid_input_name"),
        (lambda b: b["inputs"][0].update(datatype="INT64"), "invalid_datatype"),
        (lambda b: b["inputs"][0].update(shape=[2]), "invalid_shape"),
        (lambda b: b["inputs"][0].update(shape=[2000, 1]), "invalid_shape"),  # rows past max_batch_size
        (lambda b: b["inputs"][0].update(data=[1.0]), "invalid_data"),
        (lambda b: b["inputs"][0].update(data=["a", "b", "c"]), "invalid_data"),
        (lambda b: b.update(inputs=[]), "invalid_inputs"),
        (lambda b: b.update(outputs=[{"name": "NOPE"}]), "invalid_output_name"),
    ],
)
def test_tensor_lines_are_checked_against_the_catalogue(catalogue, mutate, code):
    line = tensor_line("t", [[1.0, 2.0, 3.0]])
    mutate(line["body"])
    content = jsonl([line, tensor_line("ok", [[1.0]])])
    result = _validate(content, endpoint="/v2/infer")
    assert result.ok and result.body_errors == 1 and result.work_units == 1
    assert [(line, code) for line, code, _ in _refused(content, "/v2/infer")] == [(1, code)]


def test_a_tensor_input_name_that_is_not_a_string_is_a_line_error(db, catalogue):
    bad = tensor_line("t0", [[1.0, 2.0]])
    bad["body"]["inputs"][0]["name"] = ["INPUT0"]  # unhashable: must be a line error, not a crash
    content = jsonl([bad])
    result = _validate(content, endpoint="/v2/infer")
    assert result.ok and result.body_errors == 1
    assert [(line, code) for line, code, _ in _refused(content, "/v2/infer")] == [(1, "invalid_input_name")]


def _chat_line(custom_id: str, content: str) -> dict:
    body = {"model": "tinylm", "messages": [{"role": "user", "content": content}], "max_tokens": 16}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_generation_shards_hold_the_in_flight_bound_whatever_their_estimated_time(catalogue):
    # tinylm's engine batches what a shard keeps in flight (2 x max_num_seqs): a shard cut at 1 s of estimated
    # time (here ~2 lines at a slow measured speed) would leave it mostly empty, so the kind's floor wins.
    from controlplane.fleet.models import CatalogueModel

    CatalogueModel.objects.filter(name="tinylm").update(seconds_per_work_unit=0.02, max_num_seqs=8)
    content = jsonl([_chat_line(f"g{i}", f"count from {i % 9} to 20") for i in range(40)])
    result = _validate(content, "/v1/chat/completions", shard_lines=4096, shard_seconds=1.0, min_shard_lines=4)
    assert result.ok, result.errors
    assert [s.request_count for s in result.shards] == [16, 16, 8]
    # Embeddings keep their time-cut shards (no floor of their own beyond min_shard_lines).
    lines = [embedding_line(f"r{i}", f"text {i}") for i in range(12)]
    embedded = _validate(jsonl(lines), shard_lines=4096, shard_seconds=1e-9, min_shard_lines=4)
    assert [s.request_count for s in embedded.shards] == [4, 4, 4]
