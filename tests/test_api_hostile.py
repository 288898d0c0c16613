"""JSON request bodies that are not valid input are 4xx responses in OpenAI's error shape, never a 500;
bodies over API_MAX_JSON_BYTES are 413. Multipart uploads keep their own limit (FILE_MAX_BYTES)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.batches.services import _validate_metadata
from controlplane.core.errors import PayloadTooLarge, ValidationFailed
from controlplane.core.parsers import LimitedJSONParser
from tests.batches.helpers import embedding_line, jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture
def file_id(api) -> str:
    content = jsonl([embedding_line("a", "x")])
    response = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"}, format="multipart"
    )
    return response.json()["id"]


def _body(file_id: str, **extra: object) -> bytes:
    payload = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h", **extra}
    return json.dumps(payload).encode()


def _assert_error_shape(response, status: int) -> dict:
    assert response.status_code == status, response.content[:500]
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and len(error["message"]) < 500
    return error


BODIES = {
    "nested-array-200k": lambda f: b"[" * 200_000,
    "nested-object-100k": lambda f: b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    "nested-metadata-value": lambda f: _body(f).replace(
        b"}", b', "metadata": {"k": ' + b"[" * 100 + b"]" * 100 + b"}}"
    ),
    "surrogate-in-metadata-value": lambda f: _body(f, metadata={"team": "\ud800"}),
    "surrogate-in-metadata-key": lambda f: _body(f, metadata={"\udfff": "x"}),
    "nul-in-metadata": lambda f: _body(f, metadata={"team": "a\x00b"}),
    "nul-in-input-file-id": lambda f: _body(f + "\x00"),
    "surrogate-in-endpoint": lambda f: json.dumps(
        {"input_file_id": f, "endpoint": "\ud800", "completion_window": "24h"}
    ).encode(),
    "int-5000-digits": lambda f: _body(f).replace(b"}", b', "priority": ' + b"1" * 5000 + b"}"),
    "nan-literal": lambda f: _body(f).replace(b"}", b', "priority": NaN}'),
    "invalid-utf8": lambda f: _body(f).replace(b"24h", b"24\xffh"),
    "encoded-surrogate": lambda f: _body(f).replace(b"24h", b"24\xed\xa0\x80h"),
    "truncated": lambda f: _body(f)[:-3],
    "not-an-object": lambda f: b'["input_file_id"]',
    "metadata-not-object": lambda f: _body(f, metadata=["a"]),
    "metadata-value-number": lambda f: _body(f, metadata={"a": 1}),
}


@pytest.mark.parametrize("make_body", list(BODIES.values()), ids=list(BODIES))
def test_hostile_json_body_is_a_400(api, file_id, make_body):
    response = api.post("/v1/batches", make_body(file_id), content_type="application/json")
    _assert_error_shape(response, 400)
    assert api.get("/v1/batches").status_code == 200  # the service keeps answering


def test_a_json_body_over_the_limit_is_413(api, file_id, settings):
    settings.API_MAX_JSON_BYTES = 1000
    body = _body(file_id, metadata={f"k{i}": "v" * 100 for i in range(12)})
    assert len(body) > 1000
    error = _assert_error_shape(api.post("/v1/batches", body, content_type="application/json"), 413)
    assert error["code"] == "request_too_large" and "1000 byte limit" in error["message"]
    # Just under the limit is parsed as usual.
    assert api.post("/v1/batches", _body(file_id), content_type="application/json").status_code == 200


def test_a_body_without_content_length_is_cut_at_the_limit(settings):
    # As with chunked transfer: no declared length, so the parser reads one byte past the limit and stops.
    settings.API_MAX_JSON_BYTES = 100
    stream = io.BytesIO(b'{"k": "' + b"v" * 10_000 + b'"}')
    request = SimpleNamespace(META={})
    with pytest.raises(PayloadTooLarge):
        LimitedJSONParser().parse(stream, "application/json", {"request": request})
    assert stream.tell() == 101


def test_multipart_uploads_keep_their_own_limit(api, settings):
    settings.API_MAX_JSON_BYTES = 100
    content = jsonl([embedding_line(f"r{i}", "some text") for i in range(20)])
    assert len(content) > 100
    response = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"}, format="multipart"
    )
    assert response.status_code == 200 and response.json()["bytes"] == len(content)


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/files"])
def test_form_bodies_over_djangos_limits_are_4xx(api, path, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    form = "application/x-www-form-urlencoded"
    error = _assert_error_shape(api.post(path, "a=" + "x" * 20_000, content_type=form), 413)
    assert error["code"] == "request_too_large" and "10000 byte limit" in error["message"]
    many_fields = "&".join(f"k{i}=v" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1))
    error = _assert_error_shape(api.post(path, many_fields, content_type=form), 400)
    assert error["code"] == "too_many_fields"
    assert api.get("/v1/batches").status_code == 200


@pytest.mark.parametrize(
    "path",
    ["/v1/batches?after=a%00b", "/v1/files?purpose=x&purpose=%00", "/v1/files/file-%00x", "/v1/batches/batch_%00"],
)
def test_a_nul_in_the_url_is_a_400(api, path):
    _assert_error_shape(api.get(path), 400)


@pytest.mark.parametrize(
    "metadata",
    [{"k": "\ud800"}, {"\ud800": "v"}, {"k": "a\x00b"}, {1: "v"}, {"k": None}],
    ids=["surrogate-value", "surrogate-key", "nul", "int-key", "null-value"],
)
def test_metadata_service_rejects_unstorable_text(metadata):
    with pytest.raises(ValidationFailed):
        _validate_metadata(metadata)
