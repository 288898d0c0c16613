"""GET /v1/models and /v1/models/{id}: enabled catalogue models as OpenAI Model objects (the openai SDK's
models.list()/retrieve() against the running service: tests/e2e/test_sdk.py)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.fleet.models import CatalogueModel

pytestmark = pytest.mark.django_db


def test_lists_enabled_models_in_openais_shape(api):
    CatalogueModel.objects.filter(name="identity").update(is_enabled=False)
    body = api.get("/v1/models").json()
    assert body["object"] == "list"
    names = [m["id"] for m in body["data"]]
    assert "all-MiniLM-L6-v2" in names and "identity" not in names
    minilm = next(m for m in body["data"] if m["id"] == "all-MiniLM-L6-v2")
    assert minilm["object"] == "model" and minilm["owned_by"] == "system" and isinstance(minilm["created"], int)
    assert minilm["endpoint"] == "/v1/embeddings" and minilm["embedding_dimensions"] == 384


def test_retrieve_a_tensor_model_shows_its_tensors_and_slash_names_work(api):
    CatalogueModel.objects.create(
        name="org/scorer",
        triton_name="org_scorer",
        kind="tensor",
        max_batch_size=16,
        inputs=[{"name": "X", "datatype": "FP32", "dims": [4]}],
        outputs=[{"name": "Y", "datatype": "FP32", "dims": [1]}],
    )
    body = api.get("/v1/models/org/scorer").json()
    assert (body["id"], body["endpoint"], body["max_batch_size"]) == ("org/scorer", "/v2/infer", 16)
    assert body["inputs"] == [{"name": "X", "datatype": "FP32", "dims": [4]}]


@pytest.mark.parametrize("name", ["no-such-model", "identity-disabled"])
def test_unknown_or_disabled_models_are_404_in_the_error_shape(api, name):
    CatalogueModel.objects.filter(name="identity").update(name="identity-disabled", is_enabled=False)
    response = api.get(f"/v1/models/{name}")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"


def test_models_need_a_key(db):
    assert APIClient().get("/v1/models").status_code == 401


def test_a_generation_model_lists_both_endpoints_and_its_context_length(api):
    body = api.get("/v1/models/tinylm").json()
    assert (body["kind"], body["endpoint"], body["context_length"]) == ("generation", "/v1/chat/completions", 256)
    assert body["endpoints"] == ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    assert "inputs" not in body and "embedding_dimensions" not in body
