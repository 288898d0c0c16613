"""OpenAPI description of ``/v1/models`` (core/http/openapi.py says why these serializers only document).

``ModelSerializer`` mirrors ``render.model_render``; the fuzz test checks real responses against it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers

from controlplane.core.http.openapi import RESPONSE_HEADERS, error_responses, path_id
from controlplane.fleet.models import ModelKind

TAGS = ["Models"]


class TensorSpecSerializer(serializers.Serializer[Any]):
    name = serializers.CharField()
    datatype = serializers.CharField(help_text="KServe v2 datatype: `FP32`, `INT64`, `BYTES`, ...")
    dims = serializers.ListField(child=serializers.IntegerField(), help_text="Without the batch dimension; -1: any.")


class ModelSerializer(serializers.Serializer[Any]):
    id = serializers.CharField(help_text="The name a batch line's `body.model` uses.")
    object = serializers.ChoiceField(choices=["model"])
    created = serializers.IntegerField(help_text="Unix time (seconds).")
    owned_by = serializers.CharField()
    kind = serializers.ChoiceField(choices=ModelKind.values, help_text="Extension: what the model takes.")
    endpoint = serializers.CharField(allow_null=True, help_text="Extension: the batch `endpoint` for its lines.")
    max_batch_size = serializers.IntegerField(help_text="Extension: rows per Triton call.")
    embedding_dimensions = serializers.IntegerField(
        allow_null=True, required=False, help_text="Extension, embeddings models: the vector length."
    )
    endpoints = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Extension, generation models: every batch `endpoint` that takes it (chat and completions).",
    )
    context_length = serializers.IntegerField(
        allow_null=True, required=False, help_text="Extension, generation models: prompt + completion tokens."
    )
    parent = serializers.CharField(  # type: ignore[assignment]  # a field: DRF's metaclass pops it
        required=False,
        help_text="Extension, LoRA adapters (`base:adapter` ids): the base model whose batches and engine they share.",
    )
    inputs = TensorSpecSerializer(many=True, required=False, help_text="Extension, tensor models: what a line sends.")
    outputs = TensorSpecSerializer(many=True, required=False, help_text="Extension, tensor models: what comes back.")


class ModelListSerializer(serializers.Serializer[Any]):
    object = serializers.ChoiceField(choices=["list"])
    data = ModelSerializer(many=True)  # type: ignore[assignment]  # a field: DRF's metaclass pops it


model_list = extend_schema_view(
    get=extend_schema(
        operation_id="listModels",
        summary="List the models a batch can use",
        tags=TAGS,
        parameters=RESPONSE_HEADERS,
        responses={200: ModelListSerializer, **error_responses()},
    ),
)

model_detail = extend_schema_view(
    get=extend_schema(
        operation_id="retrieveModel",
        summary="Retrieve a model",
        tags=TAGS,
        parameters=[path_id("model_id", "all-MiniLM-L6-v2"), *RESPONSE_HEADERS],
        responses={200: ModelSerializer, **error_responses(404)},
    ),
)
