"""``/v1/models``: the catalogue models a tenant may name in a batch, as OpenAI's Model objects, so the
openai SDK's ``client.models.list()`` and ``retrieve()`` work."""

from __future__ import annotations

from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.http.errors import NotFound
from controlplane.fleet import schema
from controlplane.fleet.models import split_model_name
from controlplane.fleet.render import adapter_render, model_render
from controlplane.fleet.selectors import (
    catalogue_adapter_get,
    catalogue_adapters_enabled,
    catalogue_model_get,
    catalogue_models_enabled,
)


@schema.model_list
class ModelListView(APIView):
    def get(self, request: Request) -> Response:
        # Each enabled LoRA adapter is a model of its own (`base:adapter`), listed after the models.
        data = [model_render(m) for m in catalogue_models_enabled()]
        data += [adapter_render(a) for a in catalogue_adapters_enabled()]
        return Response({"object": "list", "data": data})


@schema.model_detail
class ModelDetailView(APIView):
    def get(self, request: Request, model_id: str) -> Response:
        base_name, adapter_name = split_model_name(model_id)
        model = catalogue_model_get(name=base_name) if "\x00" not in base_name else None
        adapter = catalogue_adapter_get(base=model, name=adapter_name) if model is not None and adapter_name else None
        if model is None or (adapter_name and adapter is None):
            raise NotFound(f"The model {model_id[:200]!r} does not exist.", param="model", code="model_not_found")
        return Response(adapter_render(adapter) if adapter is not None else model_render(model))
