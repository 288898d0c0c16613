"""The one table of endpoint kinds: a batch's endpoint URL → the kind that gives it its meaning. Adding an
endpoint is adding a kind module and a row here, and its value to ``batches.models.Endpoint`` (the choices of
``Batch.endpoint``, which a migration records): tests/kinds/test_registry.py holds the two equal."""

from __future__ import annotations

from controlplane.kinds.base import EndpointKind
from controlplane.kinds.embeddings import EmbeddingsKind
from controlplane.kinds.generation.kind import ChatCompletionsKind, CompletionsKind, ResponsesKind
from controlplane.kinds.generation.kind import tokenizers_preload as generation_tokenizers_preload
from controlplane.kinds.tensors.kind import TensorKind

KINDS: dict[str, EndpointKind] = {
    kind.url: kind
    for kind in (EmbeddingsKind(), TensorKind(), ChatCompletionsKind(), CompletionsKind(), ResponsesKind())
}


class UnknownEndpoint(LookupError):
    pass


def kind_for(url: str) -> EndpointKind:
    """The kind of a batch's endpoint. Raises UnknownEndpoint: batch creation refuses any other url, so a
    batch row never holds one."""
    try:
        return KINDS[url]
    except KeyError:
        raise UnknownEndpoint(f"no endpoint kind for {url!r}; known: {sorted(KINDS)}") from None


def endpoint_urls() -> list[str]:
    return list(KINDS)


def token_endpoint_urls() -> list[str]:
    """Endpoints whose work units are tokens (the tenant's enqueued-token quota counts them)."""
    return [url for url, kind in KINDS.items() if kind.counts_tokens]


def endpoints_for_model_kind(model_kind: str) -> list[str]:
    """The endpoints a catalogue model of ``model_kind`` serves (a generation model: chat, completions and responses)."""
    return [url for url, kind in KINDS.items() if kind.model_kind == model_kind]


def endpoint_for_model_kind(model_kind: str) -> str | None:
    """The main endpoint a catalogue model of ``model_kind`` serves (the first of ``endpoints_for_model_kind``)."""
    return next(iter(endpoints_for_model_kind(model_kind)), None)


def tokenizers_preload() -> list[str]:
    """Load the enabled generation models' tokenizers into this process ahead of its first shard (each child of
    the shard worker does at start, controlplane/celery.py); the names of the models loaded."""
    return generation_tokenizers_preload()
