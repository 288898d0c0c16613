"""``/v1/models``: the catalogue models a tenant may name in a batch, as OpenAI's Model objects, so the
openai SDK's ``client.models.list()`` and ``retrieve()`` work."""

from __future__ import annotations

from typing import Any

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.errors import NotFound
from controlplane.fleet import schema
from controlplane.fleet.models import CatalogueModel, ModelKind
from controlplane.fleet.selectors import catalogue_model_get, catalogue_models_enabled

# Which batch endpoints serve each kind, the first the main one (batches.models.Endpoint; named here so fleet
# need not import batches or kinds; tests/kinds/test_registry.py holds it equal to the registry).
_ENDPOINTS = {
    ModelKind.EMBEDDINGS: ("/v1/embeddings",),
    ModelKind.TENSOR: ("/v2/infer",),
    ModelKind.GENERATION: ("/v1/chat/completions", "/v1/completions"),
}


def model_render(model: CatalogueModel) -> dict[str, Any]:
    """OpenAI's Model object plus what a batch author needs: the endpoint its lines go to, rows per
    Triton call, for tensor models the tensors a line sends and gets back, for generation models both
    endpoints and the context length (prompt + completion tokens)."""
    body: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        "created": int(model.created_at.timestamp()),
        "owned_by": "system",
        "kind": model.kind,
        "endpoint": _ENDPOINTS[ModelKind(model.kind)][0],
        "max_batch_size": model.max_batch_size,
    }
    if model.kind == ModelKind.EMBEDDINGS:
        body["embedding_dimensions"] = model.embedding_dimensions
    elif model.kind == ModelKind.GENERATION:
        # Both endpoints take the model; a batch is one endpoint, so a tenant picks one of these.
        body["endpoints"] = list(_ENDPOINTS[ModelKind.GENERATION])
        body["context_length"] = model.context_length
    else:
        body["inputs"] = model.inputs
        body["outputs"] = model.outputs
    return body


@schema.model_list
class ModelListView(APIView):
    def get(self, request: Request) -> Response:
        return Response({"object": "list", "data": [model_render(m) for m in catalogue_models_enabled()]})


@schema.model_detail
class ModelDetailView(APIView):
    def get(self, request: Request, model_id: str) -> Response:
        model = catalogue_model_get(name=model_id) if "\x00" not in model_id else None
        if model is None:
            raise NotFound(f"The model {model_id[:200]!r} does not exist.", param="model", code="model_not_found")
        return Response(model_render(model))
