"""The OpenAPI description of the tenant API: public at /v1/openapi.json, valid OpenAPI 3, one operation per
/v1 route and method, with the bodies, errors, security and headers the API really has; the Swagger UI at
/v1/docs with its assets served from this service. tests/test_api_fuzz.py checks real answers against it."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.validation import validate_schema
from rest_framework.test import APIClient
from rest_framework.views import APIView

OPERATIONS = {
    ("/v1/files", "get"): "listFiles",
    ("/v1/files", "post"): "createFile",
    ("/v1/files/{file_id}", "get"): "retrieveFile",
    ("/v1/files/{file_id}", "delete"): "deleteFile",
    ("/v1/files/{file_id}/content", "get"): "downloadFile",
    ("/v1/batches", "get"): "listBatches",
    ("/v1/batches", "post"): "createBatch",
    ("/v1/batches/{batch_id}", "get"): "retrieveBatch",
    ("/v1/batches/{batch_id}/cancel", "post"): "cancelBatch",
    ("/v1/batches/{batch_id}/rerun", "post"): "rerunBatch",
    ("/v1/models", "get"): "listModels",
    ("/v1/models/{model_id}", "get"): "retrieveModel",
    ("/v1/organization/usage/embeddings", "get"): "usageEmbeddings",
    ("/v1/organization/usage/tensors", "get"): "usageTensors",
    ("/v1/organization/costs", "get"): "usageCosts",
}
SCHEMA_VIEWS = {"/v1/openapi.json", "/v1/docs"}


@pytest.fixture(scope="module")
def openapi():
    response = APIClient().get("/v1/openapi.json")
    assert response.status_code == 200
    return response.json()


def _operations(openapi):
    for path, methods in openapi["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


def _api_routes():
    """(OpenAPI path, DRF view class) of every /v1 route in the URLconf."""

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            elif isinstance(pattern, URLPattern):
                yield prefix + str(pattern.pattern), pattern.callback

    for route, callback in walk(get_resolver().url_patterns):
        path = "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)
        view_class = getattr(callback, "cls", None)
        if path.startswith("/v1/") and path not in SCHEMA_VIEWS:
            assert view_class is not None and issubclass(view_class, APIView), path
            yield path, view_class


def test_the_schema_is_public_and_valid_openapi():
    for client in (APIClient(), APIClient(HTTP_AUTHORIZATION="Bearer sk-not-a-key")):
        response = client.get("/v1/openapi.json")
        assert response.status_code == 200  # a wrong key does not matter: the docs describe, they hold no data
        assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    validate_schema(response.json())


def test_every_api_route_and_method_is_documented(openapi):
    routes = dict(_api_routes())
    implemented = {
        (path, method)
        for path, view in routes.items()
        for method in ("get", "post", "put", "patch", "delete")
        if hasattr(view, method)
    }
    documented = {(path, method): op["operationId"] for path, method, op in _operations(openapi)}
    assert implemented == set(documented)
    assert {key: documented.get(key) for key in OPERATIONS} == OPERATIONS  # OpenAI's operation ids


def test_operations_need_the_bearer_key(openapi):
    assert openapi["components"]["securitySchemes"]["ApiKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": openapi["components"]["securitySchemes"]["ApiKey"]["description"],
    }
    for _path, _method, operation in _operations(openapi):
        assert operation["security"] == [{"ApiKey": []}]


def test_upload_is_multipart_with_file_and_purpose(openapi):
    body = openapi["paths"]["/v1/files"]["post"]["requestBody"]
    assert list(body["content"]) == ["multipart/form-data"]
    form = openapi["components"]["schemas"]["FileUploadRequest"]
    assert form["required"] == ["file", "purpose"]
    assert form["properties"]["file"] == {**form["properties"]["file"], "type": "string", "format": "binary"}
    assert form["properties"]["purpose"]["enum"] == ["batch"]
    assert form["properties"]["expires_after[seconds]"]["minimum"] == 3600


def test_batch_create_body(openapi):
    body = openapi["paths"]["/v1/batches"]["post"]["requestBody"]
    assert list(body["content"]) == ["application/json"] and body["required"]
    create = openapi["components"]["schemas"]["BatchCreateRequest"]
    assert create["required"] == ["completion_window", "endpoint", "input_file_id"]
    props = create["properties"]
    assert props["endpoint"]["enum"] == [
        "/v1/embeddings",
        "/v2/infer",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
    ]
    assert props["completion_window"]["enum"] == ["24h"]
    # null, like absent, is the tenant's default class: the body is validated with this same serializer.
    assert props["priority"]["enum"] == ["high", "normal", "low", None] and props["priority"]["nullable"]
    assert props["metadata"]["maxProperties"] == 16 and props["metadata"]["nullable"]
    [expiry_ref] = props["output_expires_after"]["allOf"]
    expiry = openapi["components"]["schemas"][expiry_ref["$ref"].rsplit("/", 1)[1]]
    assert expiry["required"] == ["anchor", "seconds"]
    assert expiry["properties"]["anchor"]["enum"] == ["created_at"]
    assert (expiry["properties"]["seconds"]["minimum"], expiry["properties"]["seconds"]["maximum"]) == (3600, 2592000)


def test_responses_are_openai_objects_and_errors(openapi):
    error_ref = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, method, operation in _operations(openapi):
        assert {"400", "401", "429"} <= set(operation["responses"]), (path, method)
        for status, response in operation["responses"].items():
            if status.startswith("4"):
                assert response["content"]["application/json"]["schema"] == error_ref, (path, method, status)
        assert "Retry-After" in operation["responses"]["429"]["headers"]
    for op in ("createFile", "createBatch", "rerunBatch"):
        [(path, method)] = [key for key, value in OPERATIONS.items() if value == op]
        assert {"409", "413"} <= set(openapi["paths"][path][method]["responses"])
    error = openapi["components"]["schemas"]["Error"]
    assert error["required"] == ["code", "message", "param", "type"]
    batch = openapi["components"]["schemas"]["Batch"]
    assert {
        "id",
        "object",
        "endpoint",
        "errors",
        "input_file_id",
        "completion_window",
        "status",
        "request_counts",
    } <= set(batch["required"])
    content = openapi["paths"]["/v1/files/{file_id}/content"]["get"]["responses"]["200"]["content"]
    assert content == {"application/jsonl": {"schema": {"type": "string", "format": "binary"}}}


def test_creates_take_an_idempotency_key(openapi):
    creates = {"createFile", "createBatch", "rerunBatch"}
    for (path, method), operation_id in OPERATIONS.items():
        operation = openapi["paths"][path][method]
        headers = {p["name"] for p in operation.get("parameters", []) if p["in"] == "header"}
        assert headers == ({"Idempotency-Key"} if operation_id in creates else set()), (path, method)


def test_links_name_real_operations(openapi):
    operation_ids = {operation["operationId"] for _path, _method, operation in _operations(openapi)}
    links = [
        link
        for _path, _method, operation in _operations(openapi)
        for link in operation["responses"]["200"].get("links", {}).values()
    ]
    assert len(links) >= 10
    assert {link["operationId"] for link in links} <= operation_ids


@pytest.mark.django_db
def test_documented_limit_bounds_are_the_views(api, openapi):
    for path in ("/v1/files", "/v1/batches"):
        [limit] = [p for p in openapi["paths"][path]["get"]["parameters"] if p["name"] == "limit"]
        maximum = limit["schema"]["maximum"]
        assert api.get(path, {"limit": maximum}).status_code == 200
        assert api.get(path, {"limit": maximum + 1}).status_code == 400
        assert api.get(path, {"limit": 0}).status_code == 400


def test_swagger_ui_is_served_with_local_assets():
    client = APIClient()
    response = client.get("/v1/docs")
    assert response.status_code == 200
    page = response.content.decode()
    assert "/v1/openapi.json" in page and "cdn." not in page
    assets = re.findall(r'(?:src|href)="(/static/drf_spectacular_sidecar/[^"]+)"', page)
    assert len(assets) == 4  # favicon, css, bundle, standalone preset
    for asset in assets:
        served = client.get(asset)
        assert served.status_code == 200, asset
        assert b"".join(served.streaming_content), asset


def test_spectacular_command_validates_without_warnings(tmp_path):
    out = tmp_path / "openapi.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    assert out.read_text().startswith("openapi: 3.0.3")
