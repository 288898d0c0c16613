"""JSON request bodies that are not valid input are 4xx responses in OpenAI's error shape, never a 500;
bodies over API_MAX_JSON_BYTES are 413. Multipart uploads keep their own limit (FILE_MAX_BYTES)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace
from typing import ClassVar

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.files.uploadhandler import FileUploadHandler

from controlplane.batches.services import metadata_validate
from controlplane.core.http.errors import PayloadTooLarge, ValidationFailed
from controlplane.core.http.parsers import LimitedJSONParser
from tests.support.batches import embedding_line, jsonl

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


class RecordingUploadHandler(FileUploadHandler):
    """First in FILE_UPLOAD_HANDLERS: sees every byte of an uploaded file Django reads, before it spools it
    to memory or to a temporary file, and passes it on."""

    received: ClassVar[list[int]] = []

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        RecordingUploadHandler.received.append(len(raw_data))
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


@pytest.fixture
def recorded_uploads(settings) -> list[int]:
    settings.FILE_UPLOAD_HANDLERS = [f"{__name__}.RecordingUploadHandler", *settings.FILE_UPLOAD_HANDLERS]
    RecordingUploadHandler.received.clear()
    return RecordingUploadHandler.received


def test_multipart_is_parsed_by_the_file_upload_alone(api, file_id, recorded_uploads):
    # 8 MiB as a file part: before, the global multipart parser spooled it to /tmp on /v1/batches (over
    # FILE_UPLOAD_MAX_MEMORY_SIZE) before the view's 400, outside FILE_MAX_BYTES and the storage quota.
    big = SimpleUploadedFile("big.jsonl", b"x" * (8 * 1024 * 1024))
    for path in ("/v1/batches", "/v1/webhook_endpoints"):
        error = _assert_error_shape(api.post(path, {"file": big, "input_file_id": file_id}, format="multipart"), 415)
        assert error["code"] == "unsupported_media_type", path
        big.seek(0)
    assert recorded_uploads == []  # not one byte of the part was read, so nothing reached memory or disk
    # The file upload still takes multipart, through the same handlers.
    content = jsonl([embedding_line("a", "x")])
    response = api.post(
        "/v1/files", {"file": SimpleUploadedFile("in.jsonl", content), "purpose": "batch"}, format="multipart"
    )
    assert response.status_code == 200 and response.json()["bytes"] == len(content)
    assert sum(recorded_uploads) == len(content)


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/files"])
def test_form_bodies_are_415_unread(api, path):
    form = "application/x-www-form-urlencoded"
    error = _assert_error_shape(api.post(path, "a=" + "x" * 20_000, content_type=form), 415)
    assert error["code"] == "unsupported_media_type"
    assert api.get("/v1/batches").status_code == 200


def test_multipart_bodies_over_djangos_limits_are_4xx(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    error = _assert_error_shape(api.post("/v1/files", {"purpose": "x" * 20_000}, format="multipart"), 413)
    assert error["code"] == "request_too_large" and "10000 byte limit" in error["message"]
    many_fields = {f"k{i}": "v" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1)}
    error = _assert_error_shape(api.post("/v1/files", many_fields, format="multipart"), 400)
    assert error["code"] == "too_many_fields"


@pytest.mark.parametrize(
    "path",
    ["/v1/batches?after=a%00b", "/v1/files?purpose=x&purpose=%00", "/v1/files/file-%00x", "/v1/batches/batch_%00"],
)
def test_a_nul_in_the_url_is_a_400(api, path):
    _assert_error_shape(api.get(path), 400)


@pytest.mark.parametrize("declared", ["abc", "-5", "1e3"])
def test_a_malformed_content_length_is_a_4xx_not_a_500(api, file_id, declared):
    # Found probing the fuzzer's blind spots: POST /v1/files did int(CONTENT_LENGTH) and answered 500.
    upload = api.generic(
        "POST", "/v1/files", b"--x\r\n", content_type="multipart/form-data; boundary=x", CONTENT_LENGTH=declared
    )
    _assert_error_shape(upload, 400)  # no file read (Django takes the length as 0), or a multipart parse error
    created = api.generic(
        "POST", "/v1/batches", _body(file_id), content_type="application/json", CONTENT_LENGTH=declared
    )
    assert 400 <= created.status_code < 500 and "error" in created.json()


@pytest.mark.parametrize(
    "path",
    ["/v1/files/a%2Fb", "/v1/files/", "/v1/batches/batch_x/", "/v1/nope", "/v1/files/x/content/more", "/v1/"],
)
def test_a_v1_url_that_matches_no_route_is_an_openai_404(api, path):
    # The id's slash (%2F decodes to /) or a trailing slash matches no route: Django's HTML page before.
    response = api.get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "unknown_url"


def test_a_format_query_parameter_is_ignored(api):
    # DRF's URL_FORMAT_OVERRIDE turned ?format=csv into a 404 "Not found." on every endpoint.
    assert api.get("/v1/files", {"format": "csv"}).status_code == 200
    assert api.get("/v1/batches", {"format": "api"}).status_code == 200


def test_errors_outside_drf_keep_the_shape_only_under_v1(rf):
    from controlplane.core.http import error_pages as http_errors

    api_error = http_errors.server_error(rf.get("/v1/files"))
    assert api_error.status_code == 500 and json.loads(api_error.content)["error"]["type"] == "server_error"
    assert json.loads(http_errors.bad_request(rf.get("/v1/files"), ValueError()).content)["error"]["code"]
    admin_page = http_errors.not_found(rf.get("/admin/nope"), ValueError())
    assert admin_page.status_code == 404 and admin_page["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    "metadata",
    [{"k": "\ud800"}, {"\ud800": "v"}, {"k": "a\x00b"}, {1: "v"}, {"k": None}],
    ids=["surrogate-value", "surrogate-key", "nul", "int-key", "null-value"],
)
def test_metadata_service_rejects_unstorable_text(metadata):
    with pytest.raises(ValidationFailed):
        metadata_validate(metadata)
