"""A hostile-input corpus: every line that is not a valid request is a line error with its line number
and a clear code, never an exception out of validation; the errors saved on the batch stay small and
storable. An envelope problem (not JSON, no custom_id, …) fails the batch; a body its endpoint kind refuses is
planned as a 400 line and the batch runs on (OpenAI's per-line semantics). A handful of cases also go through
the API and batch_validate to a terminal (or running) state."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import OperationalError

from controlplane.batches import services
from controlplane.batches.intake import verdict
from controlplane.batches.intake.requests import ModelResolver, parse_line
from controlplane.batches.intake.validation import ValidationResult, validate_input
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.core.messaging import dispatch
from controlplane.fleet.models import CatalogueModel
from tests.support.batches import embedding_line, jsonl, tensor_line

pytestmark = pytest.mark.django_db

EMB, TENSOR = "/v1/embeddings", "/v2/infer"
DTYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64")
DIGITS_5000 = b"1" * 5000


def _validate(content: bytes, endpoint: str = EMB, **kw: Any) -> ValidationResult:
    options = {"max_line_bytes": 2 * 1024 * 1024, "max_lines": 1000, "shard_lines": 3} | kw
    return validate_input(io.BytesIO(content), endpoint=endpoint, **options)


@pytest.fixture
def typed_models(catalogue):
    """One tensor model per KServe datatype: input X and output Y of that type, any length."""
    for datatype in (*DTYPES, "BYTES"):
        CatalogueModel.objects.create(
            name=f"typed-{datatype.lower()}",
            triton_name=f"typed-{datatype.lower()}",
            kind="tensor",
            max_batch_size=8,
            inputs=[{"name": "X", "datatype": datatype, "dims": [-1]}],
            outputs=[{"name": "Y", "datatype": datatype, "dims": [-1]}],
        )


def emb(mutate: Callable[[dict[str, Any]], Any] | None = None, *, custom_id: str = "bad") -> bytes:
    line = embedding_line(custom_id, "some text")
    if mutate is not None:
        mutate(line)
    return json.dumps(line).encode()


def tensor(mutate: Callable[[dict[str, Any]], Any]) -> bytes:
    line = tensor_line("bad", [[1.0, 2.0]])
    mutate(line)
    return json.dumps(line).encode()


def typed(datatype: str, data: list[Any]) -> bytes:
    line = {
        "custom_id": "bad",
        "method": "POST",
        "url": TENSOR,
        "body": {
            "model": f"typed-{datatype.lower()}",
            "inputs": [{"name": "X", "datatype": datatype, "shape": [1, len(data)], "data": data}],
        },
    }
    return json.dumps(line).encode()


def with_raw(line: bytes, placeholder: str, raw: bytes) -> bytes:
    """Put bytes json.dumps cannot write (NaN as a literal, 5,000-digit integers, deep nesting) in a line."""
    marker = json.dumps(placeholder).encode()
    assert marker in line
    return line.replace(marker, raw, 1)


def nested(depth: int, inner: bytes = b'"x"') -> bytes:
    return b"[" * depth + inner + b"]" * depth


def set_in(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Mutator setting ``body.inputs.0.name``-style paths (list indexes as numbers)."""

    def mutate(line: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = line
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value

    return mutate


# (endpoint, the bad line, expected code or None when the line is valid). The line sits between two
# good ones, so a crash or a wrong line number cannot pass.
CASES: dict[str, tuple[str, bytes, str | None]] = {
    # Nesting: json.loads would raise RecursionError; the depth bound is the same in every caller.
    "nested-array-200k": (EMB, b"[" * 200_000, "invalid_json"),
    "nested-object-200k": (EMB, b'{"a":' * 200_000, "invalid_json"),
    "nested-array-200k-closed": (EMB, nested(200_000), "invalid_json"),
    "nested-65-in-input": (EMB, with_raw(emb(set_in("body.input", "X")), "X", nested(65)), "invalid_json"),
    "nested-40-in-tensor-data": (
        TENSOR,
        with_raw(tensor(set_in("body.inputs.0.data", "X")), "X", nested(40, b"1")),
        "invalid_data",
    ),
    "brackets-inside-strings-are-text": (EMB, emb(set_in("body.input", "[{" * 5000)), None),
    # Numbers past Python's limits.
    "int-5000-digits-custom-id": (EMB, with_raw(emb(set_in("custom_id", "X")), "X", DIGITS_5000), "invalid_json"),
    "int-5000-digits-dimensions": (
        EMB,
        with_raw(emb(set_in("body.dimensions", "X")), "X", DIGITS_5000),
        "invalid_json",
    ),
    "int-4000-digits-shape": (
        TENSOR,
        with_raw(tensor(set_in("body.inputs.0.shape", "X")), "X", b"[" + b"9" * 4000 + b", 2]"),
        "invalid_shape",
    ),
    "int-4000-digits-tensor-data": (
        TENSOR,
        with_raw(tensor(set_in("body.inputs.0.data", "X")), "X", b"[" + b"9" * 4000 + b", 2]"),
        "invalid_data",
    ),
    "nan-literal": (TENSOR, with_raw(tensor(set_in("body.inputs.0.data", "X")), "X", b"[NaN, 1]"), "invalid_json"),
    "infinity-literal": (
        TENSOR,
        with_raw(tensor(set_in("body.inputs.0.data", "X")), "X", b"[1, Infinity]"),
        "invalid_json",
    ),
    "minus-infinity-dimensions": (
        EMB,
        with_raw(emb(set_in("body.dimensions", "X")), "X", b"-Infinity"),
        "invalid_json",
    ),
    "float-1e400-is-inf": (
        TENSOR,
        with_raw(tensor(set_in("body.inputs.0.data", "X")), "X", b"[1e400, 1]"),
        "invalid_data",
    ),
    # Tensor values that numpy would wrap, truncate or overflow, per datatype.
    "int8-1e30": (TENSOR, typed("INT8", [1e30]), "invalid_data"),
    "int8-128": (TENSOR, typed("INT8", [128]), "invalid_data"),
    "int8-fraction": (TENSOR, typed("INT8", [1.5]), "invalid_data"),
    "uint8-negative": (TENSOR, typed("UINT8", [-1]), "invalid_data"),
    "int16-40000": (TENSOR, typed("INT16", [40_000]), "invalid_data"),
    "uint16-70000": (TENSOR, typed("UINT16", [70_000]), "invalid_data"),
    "int32-2**31": (TENSOR, typed("INT32", [2**31]), "invalid_data"),
    "uint32-2**32": (TENSOR, typed("UINT32", [2**32]), "invalid_data"),
    "int64-2**63": (TENSOR, typed("INT64", [2**63]), "invalid_data"),
    "uint64-2**64": (TENSOR, typed("UINT64", [2**64]), "invalid_data"),
    "fp16-1e5": (TENSOR, typed("FP16", [1e5]), "invalid_data"),
    "fp32-1e39": (TENSOR, typed("FP32", [1e39]), "invalid_data"),
    "bool-2": (TENSOR, typed("BOOL", [2]), "invalid_data"),
    "int32-numeric-string": (TENSOR, typed("INT32", ["1"]), "invalid_data"),
    "bytes-number": (TENSOR, typed("BYTES", ["ok", 1]), "invalid_data"),
    "int8-bounds-are-valid": (TENSOR, typed("INT8", [-128, 127]), None),
    "uint64-max-is-valid": (TENSOR, typed("UINT64", [2**64 - 1]), None),
    "int64-max-is-valid": (TENSOR, typed("INT64", [2**63 - 1, -(2**63)]), None),
    "fp64-1e308-is-valid": (TENSOR, typed("FP64", [1e308]), None),
    "bool-values-are-valid": (TENSOR, typed("BOOL", [True, False]), None),
    # Lone surrogates: decodable JSON, but no text encoding can write them again.
    "surrogate-custom-id": (EMB, emb(custom_id="\ud800"), "invalid_unicode"),
    "low-surrogate-custom-id": (EMB, emb(custom_id="a\udc00b"), "invalid_unicode"),
    "surrogate-model": (EMB, emb(set_in("body.model", "\udbff")), "invalid_unicode"),
    "surrogate-input": (EMB, emb(set_in("body.input", "text \ud800")), "invalid_unicode"),
    "surrogate-input-list": (EMB, emb(set_in("body.input", ["fine", "\udfff"])), "invalid_unicode"),
    "surrogate-in-a-key": (EMB, emb(set_in("body.\ud800", "x")), "invalid_unicode"),
    "surrogate-bytes-raw-utf8": (EMB, emb(custom_id="SUR").replace(b"SUR", b"\xed\xa0\x80"), "invalid_json"),
    "surrogate-pair-is-valid": (EMB, emb(set_in("body.input", "emoji \U0001f600")), None),
    "escaped-backslash-u-is-valid": (EMB, emb(set_in("body.input", "\\ud800 is text")), None),
    # NUL: allowed in text, impossible as a model name (Postgres refuses NUL in text).
    "nul-in-model": (EMB, emb(set_in("body.model", "all-MiniLM\x00-L6-v2")), "model_not_found"),
    "nul-in-input-is-valid": (EMB, emb(set_in("body.input", "a\x00b")), None),
    "nul-in-custom-id-is-valid": (EMB, emb(custom_id="id\x00nul"), None),
    "raw-nul-byte": (EMB, emb(custom_id="N").replace(b'"N"', b'"\x00"'), "invalid_json"),
    "raw-control-char": (EMB, emb(custom_id="N").replace(b'"N"', b'"\x01"'), "invalid_json"),
    # Encodings.
    "latin1-byte": (EMB, emb(set_in("body.input", "LAT")).replace(b"LAT", b"caf\xe9"), "invalid_json"),
    "utf16-line": (EMB, emb().decode().encode("utf-16-le"), "invalid_json"),
    "bom-on-a-later-line-is-valid": (EMB, b"\xef\xbb\xbf" + emb(), None),
    # Wrong types at every field.
    "top-level-array": (EMB, b"[1, 2]", "invalid_request"),
    "top-level-string": (EMB, b'"line"', "invalid_request"),
    "top-level-null": (EMB, b"null", "invalid_request"),
    "top-level-number": (EMB, b"12", "invalid_request"),
    "custom-id-int": (EMB, emb(set_in("custom_id", 7)), "missing_custom_id"),
    "custom-id-list": (EMB, emb(set_in("custom_id", ["a"])), "missing_custom_id"),
    "custom-id-object": (EMB, emb(set_in("custom_id", {"a": 1})), "missing_custom_id"),
    "custom-id-null": (EMB, emb(set_in("custom_id", None)), "missing_custom_id"),
    "custom-id-too-long": (EMB, emb(custom_id="x" * 513), "invalid_custom_id"),
    "method-list": (EMB, emb(set_in("method", ["POST"])), "invalid_method"),
    "method-huge": (EMB, emb(set_in("method", "G" * 100_000)), "invalid_method"),
    "url-object": (EMB, emb(set_in("url", {"path": EMB})), "mismatched_url"),
    "body-list": (EMB, emb(set_in("body", [1])), "invalid_body"),
    "body-null": (EMB, emb(set_in("body", None)), "invalid_body"),
    "model-int": (EMB, emb(set_in("body.model", 3)), "missing_model"),
    "model-object": (EMB, emb(set_in("body.model", {"name": "x"})), "missing_model"),
    "model-path-like": (EMB, emb(set_in("body.model", "../../../etc/passwd")), "model_not_found"),
    "model-huge": (EMB, emb(set_in("body.model", "m" * 100_000)), "model_not_found"),
    "input-object": (EMB, emb(set_in("body.input", {"text": "x"})), "invalid_input"),
    "input-null": (EMB, emb(set_in("body.input", None)), "invalid_input"),
    "input-bool": (EMB, emb(set_in("body.input", True)), "invalid_input"),
    "input-nested-list": (EMB, emb(set_in("body.input", [["x"]])), "invalid_input"),
    "encoding-format-list": (EMB, emb(set_in("body.encoding_format", ["float"])), "invalid_value"),
    "dimensions-string": (EMB, emb(set_in("body.dimensions", "384")), "invalid_value"),
    "dimensions-bool": (EMB, emb(set_in("body.dimensions", True)), "invalid_value"),
    "inputs-object": (TENSOR, tensor(set_in("body.inputs", {"name": "INPUT0"})), "invalid_inputs"),
    "inputs-strings": (TENSOR, tensor(set_in("body.inputs", ["INPUT0"])), "invalid_inputs"),
    "input-name-object": (TENSOR, tensor(set_in("body.inputs.0.name", {"a": 1})), "invalid_input_name"),
    "input-name-nul": (TENSOR, tensor(set_in("body.inputs.0.name", "INPUT0\x00")), "invalid_input_name"),
    "datatype-list": (TENSOR, tensor(set_in("body.inputs.0.datatype", ["FP32"])), "invalid_datatype"),
    "shape-string": (TENSOR, tensor(set_in("body.inputs.0.shape", "1,2")), "invalid_shape"),
    "shape-bools": (TENSOR, tensor(set_in("body.inputs.0.shape", [True, 2])), "invalid_shape"),
    "shape-negative": (TENSOR, tensor(set_in("body.inputs.0.shape", [-1, 2])), "invalid_shape"),
    "shape-float": (TENSOR, tensor(set_in("body.inputs.0.shape", [1.0, 2])), "invalid_shape"),
    "data-object": (TENSOR, tensor(set_in("body.inputs.0.data", {"0": 1.0})), "invalid_data"),
    "data-null": (TENSOR, tensor(set_in("body.inputs.0.data", None)), "invalid_data"),
    "data-scalar": (TENSOR, tensor(set_in("body.inputs.0.data", 1.0)), "invalid_data"),
    "data-ragged": (TENSOR, tensor(set_in("body.inputs.0.data", [[1.0], [2.0, 3.0]])), "invalid_data"),
    "data-null-value": (TENSOR, tensor(set_in("body.inputs.0.data", [1.0, None])), "invalid_data"),
    "outputs-string": (TENSOR, tensor(set_in("body.outputs", "OUTPUT0")), "invalid_outputs"),
    "output-name-object": (TENSOR, tensor(set_in("body.outputs", [{"name": {"a": 1}}])), "invalid_output_name"),
    # Repetition: many items in one line.
    "input-2049-items": (EMB, emb(set_in("body.input", ["a"] * 2049)), "invalid_input"),
}


# The codes of a body the endpoint kind refuses: a 400 line in the error file, not a failed batch.
BODY_CODES = {
    "invalid_input",
    "invalid_value",
    "invalid_inputs",
    "invalid_input_name",
    "invalid_datatype",
    "invalid_shape",
    "invalid_data",
    "invalid_outputs",
    "invalid_output_name",
    "missing_input",
}


@pytest.mark.parametrize(("endpoint", "bad", "code"), list(CASES.values()), ids=list(CASES))
def test_hostile_line_is_a_line_error_with_its_number(typed_models, endpoint, bad, code):
    if code is None:  # valid, however odd: accepted on its own (neighbours could name another model)
        result = _validate(jsonl([bad]), endpoint=endpoint)
        assert result.ok and result.total == 1, result.errors
        return
    if code in BODY_CODES:
        # A typed-* line between identity lines would be mixed_models (an envelope error): it goes alone.
        alone = json.loads(bad)["body"]["model"].startswith("typed-")
        lines = [bad] if alone else [_good(endpoint, "ok-1"), bad, _good(endpoint, "ok-2")]
        result = _validate(jsonl(lines), endpoint=endpoint)
        assert result.ok and result.total == len(lines) and result.body_errors == 1, result.errors
        issue = parse_line(jsonl([bad]), endpoint=endpoint, resolver=ModelResolver()).issue
        assert issue is not None and issue.code == code and issue.param
        _assert_storable([{"message": issue.message, "param": issue.param}])
        return
    result = _validate(jsonl([_good(endpoint, "ok-1"), bad, _good(endpoint, "ok-2")]), endpoint=endpoint)
    assert [(e["line"], e["code"]) for e in result.errors] == [(2, code)], result.errors
    _assert_storable(result.errors)


def _good(endpoint: str, custom_id: str) -> dict[str, Any]:
    return tensor_line(custom_id, [[1.0, 2.0]]) if endpoint == TENSOR else embedding_line(custom_id, "x")


def _assert_storable(errors: list[dict[str, Any]]) -> None:
    """What batch_validate saves: short messages Postgres's jsonb accepts (no NUL, valid UTF-8)."""
    for error in errors:
        assert len(error["message"]) <= 700, error["message"][:300]
        assert error["param"] is None or len(error["param"]) <= 200
    encoded = json.dumps(errors)
    encoded.encode("utf-8")
    assert "\\u0000" not in encoded


def test_bom_and_crlf_file_is_valid(catalogue):
    lines = [json.dumps(embedding_line(f"r{i}", f"text {i}")).encode() for i in range(3)]
    content = b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n"
    result = _validate(content)
    assert result.ok, result.errors
    assert result.total == 3 and result.shards[0].start_byte == 0


def test_an_over_long_line_is_reported_without_its_content(catalogue):
    huge = emb(set_in("body.input", "word " * 20_000))
    result = _validate(jsonl([embedding_line("a", "x"), huge]), max_line_bytes=1024)
    assert [(e["line"], e["code"]) for e in result.errors] == [(2, "line_too_long")]


def test_repeated_lines_report_a_bounded_error_list(catalogue):
    line = emb(custom_id="same")
    result = _validate(line + b"\n" + (line + b"\n") * 5000, max_lines=10_000)
    assert result.error_count == 5000 and len(result.errors) == 100
    assert {e["code"] for e in result.errors} == {"duplicate_custom_id"}


def test_quoted_values_are_truncated(catalogue):
    result = _validate(jsonl([emb(set_in("body.model", "m" * 100_000))]))
    message = result.errors[0]["message"]
    assert "does not exist" in message and len(message) < 300


# --- Through the API and batch_validate ------------------------------------------------------------


@pytest.fixture
def no_broker(monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


def _create_via_api(api, content: bytes, endpoint: str) -> str:
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"}, format="multipart"
    )
    assert upload.status_code == 200, upload.json()
    created = api.post(
        "/v1/batches",
        {"input_file_id": upload.json()["id"], "endpoint": endpoint, "completion_window": "24h"},
        format="json",
    )
    assert created.status_code == 200, created.json()
    return created.json()["id"]


API_CASES: dict[str, tuple[str, bytes, list[tuple[int, str]]]] = {
    "nested-200k": (EMB, CASES["nested-array-200k"][1], [(2, "invalid_json")]),
    "int-5000-digits": (EMB, CASES["int-5000-digits-custom-id"][1], [(2, "invalid_json")]),
    "surrogate-custom-id": (EMB, CASES["surrogate-custom-id"][1], [(2, "invalid_unicode")]),
    "surrogate-input": (EMB, CASES["surrogate-input"][1], [(2, "invalid_unicode")]),
    "nul-in-model": (EMB, CASES["nul-in-model"][1], [(2, "model_not_found")]),
    "shape-negative-runs-as-a-400-line": (TENSOR, CASES["shape-negative"][1], []),
    "nul-in-input-runs": (EMB, CASES["nul-in-input-is-valid"][1], []),
}


@pytest.mark.parametrize(("endpoint", "bad", "expected"), list(API_CASES.values()), ids=list(API_CASES))
def test_hostile_file_through_the_api_ends_failed_or_running(api, typed_models, no_broker, endpoint, bad, expected):
    batch_id = _create_via_api(api, jsonl([_good(endpoint, "ok-1"), bad, _good(endpoint, "ok-2")]), endpoint)
    services.batch_validate(batch_id=batch_id)
    body = api.get(f"/v1/batches/{batch_id}").json()
    if not expected:
        assert body["status"] == BatchStatus.IN_PROGRESS
        assert body["request_counts"]["total"] == 3
        refused = 1 if bad == CASES["shape-negative"][1] else 0
        assert sum(Shard.objects.filter(batch_id=batch_id).values_list("body_errors", flat=True)) == refused
        return
    assert body["status"] == BatchStatus.FAILED
    assert [(e["line"], e["code"]) for e in body["errors"]["data"]] == expected
    assert api.get("/v1/batches").status_code == 200  # the service keeps answering


def test_an_unexpected_failure_fails_the_batch_with_validation_error(api, catalogue, no_broker, monkeypatch):
    batch_id = _create_via_api(api, jsonl([embedding_line("a", "x")]), EMB)

    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(verdict, "validate_input", explode)
    services.batch_validate(batch_id=batch_id)
    batch = Batch.objects.get(id=batch_id)
    assert batch.status == BatchStatus.FAILED
    [error] = batch.errors["data"]
    assert error["code"] == "validation_error" and "RuntimeError" in error["message"]


def test_a_lost_database_connection_is_raised_for_a_retry(api, catalogue, no_broker, monkeypatch):
    batch_id = _create_via_api(api, jsonl([embedding_line("a", "x")]), EMB)

    def lost(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(verdict, "validate_input", lost)
    with pytest.raises(OperationalError):
        services.batch_validate(batch_id=batch_id)
    assert Batch.objects.get(id=batch_id).status == BatchStatus.VALIDATING
