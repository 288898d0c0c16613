"""The registry is the one table of endpoints: the batch model's choices, batch creation and the layering
rule of kinds/ all follow it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from controlplane.batches.models import Endpoint
from controlplane.core.http.errors import ValidationFailed
from controlplane.fleet.models import ModelKind
from controlplane.kinds.registry import (
    KINDS,
    UnknownEndpoint,
    endpoint_for_model_kind,
    endpoints_for_model_kind,
    kind_for,
    token_endpoint_urls,
)

KINDS_DIR = Path(__file__).resolve().parents[2] / "controlplane" / "kinds"
# kinds/ sits below the batch pipeline: it may not import the layers that use it.
FORBIDDEN = ("controlplane.batches", "controlplane.scheduling", "controlplane.metrics", "controlplane.console")


def test_batch_endpoint_choices_are_the_registry():
    assert sorted(Endpoint.values) == sorted(KINDS)


def test_every_model_kind_is_served_by_its_endpoints_and_every_endpoint_by_one_kind():
    served = {kind.model_kind for kind in KINDS.values()}
    assert served == set(ModelKind.values)
    assert sorted(url for k in ModelKind.values for url in endpoints_for_model_kind(k)) == sorted(KINDS)
    assert endpoints_for_model_kind(ModelKind.GENERATION) == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
    ]
    assert endpoint_for_model_kind(ModelKind.GENERATION) == "/v1/chat/completions"


def test_models_endpoint_names_the_registry_endpoints_of_each_kind():
    # fleet sits below kinds/ and keeps its own map for /v1/models; it must agree with the registry.
    from controlplane.fleet.render import _ENDPOINTS

    assert {kind: list(urls) for kind, urls in _ENDPOINTS.items()} == {
        k: endpoints_for_model_kind(k) for k in ModelKind.values
    }


def test_lookups():
    assert kind_for("/v1/embeddings").counts_tokens and not kind_for("/v2/infer").counts_tokens
    assert token_endpoint_urls() == ["/v1/embeddings", "/v1/chat/completions", "/v1/completions", "/v1/responses"]
    with pytest.raises(UnknownEndpoint):
        kind_for("/v1/chat/completion")


@pytest.mark.django_db
def test_batch_create_refuses_an_endpoint_outside_the_registry(tenant):
    from controlplane.batches.services import batch_create

    for endpoint in ("/v1/nope", ["/v1/embeddings"], None):
        with pytest.raises(ValidationFailed, match="endpoint must be one of"):
            batch_create(tenant=tenant, input_file_id="file-x", endpoint=endpoint, completion_window="24h")


def test_kinds_import_nothing_above_them():
    for path in sorted(KINDS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            bad = [name for name in names if name.startswith(FORBIDDEN)]
            assert not bad, f"{path.name} imports {bad}"
