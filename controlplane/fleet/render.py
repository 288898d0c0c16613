"""The fleet's API objects as plain dicts: OpenAI's Model object for ``/v1/models`` (fleet/schema.py documents
it) and a server for ``/internal/fleet/servers``."""

from __future__ import annotations

from typing import Any

from controlplane.fleet.models import CatalogueAdapter, CatalogueModel, ModelKind, TritonServer

# Which batch endpoints serve each kind, the first the main one (batches.models.Endpoint; named here so fleet
# need not import batches or kinds; tests/kinds/test_registry.py holds it equal to the registry).
_ENDPOINTS = {
    ModelKind.EMBEDDINGS: ("/v1/embeddings",),
    ModelKind.TENSOR: ("/v2/infer",),
    ModelKind.GENERATION: ("/v1/chat/completions", "/v1/completions", "/v1/responses"),
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
        # Every generation endpoint takes the model; a batch is one endpoint, so a tenant picks one of these.
        body["endpoints"] = list(_ENDPOINTS[ModelKind.GENERATION])
        body["context_length"] = model.context_length
    else:
        body["inputs"] = model.inputs
        body["outputs"] = model.outputs
    return body


def adapter_render(adapter: CatalogueAdapter) -> dict[str, Any]:
    """A LoRA adapter as a Model of its own (``base:adapter``, the name its lines use), its base's facts, and
    ``parent`` (vLLM's /v1/models names an adapter's base so too)."""
    return {
        **model_render(adapter.base),
        "id": adapter.full_name,
        "created": int(adapter.created_at.timestamp()),
        "parent": adapter.base.name,
    }


def server_render(server: TritonServer, *, created: bool) -> dict[str, Any]:
    return {
        "object": "fleet.server",
        "name": server.name,
        "grpc_url": server.grpc_url,
        "http_url": server.http_url,
        "metrics_url": server.metrics_url,
        "pool": server.pool,
        "state": server.state,
        "real_gpus": server.real_gpus,
        "gpus": [{"index": g.index, "memory_bytes": g.total_memory_bytes} for g in server.gpus.all()],
        "created": created,
    }
