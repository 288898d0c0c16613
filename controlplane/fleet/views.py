"""``/v1/models``: the catalogue models a tenant may name in a batch, as OpenAI's Model objects, so the
openai SDK's ``client.models.list()`` and ``retrieve()`` work."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.http.errors import NotFound
from controlplane.fleet import schema
from controlplane.fleet.render import model_render
from controlplane.fleet.selectors import catalogue_model_get, catalogue_models_enabled


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
