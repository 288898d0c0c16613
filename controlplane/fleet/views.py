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

# Which batch endpoint serves each kind (batches.models.Endpoint; named here so fleet need not import batches).
_ENDPOINT = {ModelKind.EMBEDDINGS: "/v1/embeddings", ModelKind.TENSOR: "/v2/infer"}


def model_render(model: CatalogueModel) -> dict[str, Any]:
    """OpenAI's Model object plus what a batch author needs: the endpoint its lines go to, rows per
    Triton call, and for tensor models the tensors a line sends and gets back."""
    body: dict[str, Any] = {
        "id": model.name,
        "object": "model",
        "created": int(model.created_at.timestamp()),
        "owned_by": "system",
        "kind": model.kind,
        "endpoint": _ENDPOINT.get(ModelKind(model.kind)),
        "max_batch_size": model.max_batch_size,
    }
    if model.kind == ModelKind.EMBEDDINGS:
        body["embedding_dimensions"] = model.embedding_dimensions
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
