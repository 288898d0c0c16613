"""The fleet's API objects as plain dicts: OpenAI's Model object for ``/v1/models`` (fleet/schema.py documents
it) and a server for ``/internal/fleet/servers``."""

from __future__ import annotations

from typing import Any

from controlplane.fleet.models import CatalogueModel, ModelKind, TritonServer

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
