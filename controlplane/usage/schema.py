"""The usage and costs API: the query serializers the views validate with (core/http/input.py) and the OpenAPI
description built from them. The response serializers only document (core/http/openapi.py says why): the
objects mirror usage/reports.py."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers

from controlplane.core.http.openapi import RESPONSE_HEADERS, error_responses
from controlplane.usage.reports import ReportQuery, report_query_parse

TAGS = ["Usage"]


class AmountSerializer(serializers.Serializer[Any]):
    value = serializers.FloatField()
    currency = serializers.CharField(help_text="`usd`.")


class CostAmountSerializer(AmountSerializer):
    exact = serializers.CharField(help_text="Extension: the exact decimal sum (9 decimal places).")


class _ResultSerializer(serializers.Serializer[Any]):
    object = serializers.CharField()
    project_id = serializers.CharField(allow_null=True, help_text="Always null: no projects here.")
    api_key_id = serializers.CharField(allow_null=True, help_text="With group_by=api_key_id: `key_<id>`.")
    model = serializers.CharField(allow_null=True, help_text="With group_by=model.")
    batch_id = serializers.CharField(allow_null=True, help_text="Extension, with group_by=batch.")


class _UsageResultSerializer(_ResultSerializer):
    user_id = serializers.CharField(allow_null=True, help_text="Always null.")
    num_model_requests = serializers.IntegerField(help_text="Lines that completed.")
    compute_seconds = serializers.FloatField(help_text="Extension: attributed compute seconds.")


class EmbeddingsResultSerializer(_UsageResultSerializer):
    input_tokens = serializers.IntegerField()


class TensorsResultSerializer(_UsageResultSerializer):
    rows = serializers.IntegerField(help_text="Tensor rows (the first dimension of each input).")


class CompletionsResultSerializer(_UsageResultSerializer):
    input_tokens = serializers.IntegerField(help_text="Prompt tokens, cached ones included.")
    input_cached_tokens = serializers.IntegerField(help_text="Prompt tokens served from the engine's prefix cache.")
    output_tokens = serializers.IntegerField()
    input_audio_tokens = serializers.IntegerField(help_text="Always 0.")
    output_audio_tokens = serializers.IntegerField(help_text="Always 0.")
    batch = serializers.BooleanField(allow_null=True, help_text="With group_by=batch: true (every line is a batch's).")


class CostsResultSerializer(_ResultSerializer):
    amount = CostAmountSerializer()
    line_item = serializers.CharField(
        allow_null=True, help_text="With group_by=line_item: `<model>, tokens|output tokens|rows|compute`."
    )


def _page_of(result: type[serializers.Serializer[Any]], name: str) -> type[serializers.Serializer[Any]]:
    bucket = type(
        f"{name}Bucket",
        (serializers.Serializer,),
        {
            "object": serializers.ChoiceField(choices=["bucket"]),
            "start_time": serializers.IntegerField(),
            "end_time": serializers.IntegerField(),
            "start_time_iso": serializers.CharField(),
            "end_time_iso": serializers.CharField(),
            "results": result(many=True),
        },
    )
    return type(
        f"{name}Page",
        (serializers.Serializer,),
        {
            "object": serializers.ChoiceField(choices=["page"]),
            "data": bucket(many=True),
            "has_more": serializers.BooleanField(),
            "next_page": serializers.CharField(allow_null=True, help_text="Pass as `page` for the next buckets."),
        },
    )


_GROUPS = ["model", "api_key_id", "api_key", "batch", "batch_id", "project_id", "user_id"]


def _array(help_text: str, choices: list[str] | None = None) -> serializers.ListField:
    child = serializers.ChoiceField(choices=choices) if choices else serializers.CharField()
    return serializers.ListField(child=child, required=False, help_text=help_text)


class UsageQuerySerializer(serializers.Serializer[Any]):
    # The query of a usage report. Its fields describe the parameters; reports.report_query_parse checks them
    # as a whole (arrays come three ways, the page must belong to the query), naming the parameter at fault.
    # (A comment, not a docstring: drf-spectacular would publish a docstring as the component's description.)
    costs = False

    start_time = serializers.IntegerField(help_text="Unix seconds, inclusive.")
    end_time = serializers.IntegerField(required=False, help_text="Unix seconds, exclusive; default now.")
    bucket_width = serializers.ChoiceField(choices=["1m", "1h", "1d"], required=False, help_text="Default 1d.")
    limit = serializers.IntegerField(
        required=False, help_text="Buckets per page: 1d default 7 max 31, 1h 24/168, 1m 60/1440."
    )
    page = serializers.CharField(required=False, help_text="`next_page` of the previous page.")
    models = _array("Only these models.")
    api_key_ids = _array("Only these API keys (`key_<id>`).")
    group_by = _array("Group results by these fields.", _GROUPS)
    format = serializers.ChoiceField(
        choices=["csv"], required=False, help_text="`csv`: the same page as CSV (or `Accept: text/csv`)."
    )

    def to_internal_value(self, data: Any) -> dict[str, ReportQuery]:
        return {"query": report_query_parse(data, costs=self.costs)}


class CostsQuerySerializer(UsageQuerySerializer):
    costs = True
    group_by = _array("Group results by these fields.", [*_GROUPS, "line_item"])


_CSV = {
    "text/csv": OpenApiResponse(
        response=OpenApiTypes.STR, description="One row per bucket result; `X-Next-Page` header when more."
    )
}


def _usage(kind: str, result: type[serializers.Serializer[Any]], name: str) -> Any:
    return extend_schema_view(
        get=extend_schema(
            operation_id=f"usage{name}",
            summary=f"{name} usage of the tenant, in time buckets",
            description="Array parameters are accepted repeated (`group_by=model`), with brackets "
            "(`group_by[]=model`, as the openai SDK sends them) or comma-separated.",
            tags=TAGS,
            parameters=[UsageQuerySerializer, *RESPONSE_HEADERS],
            responses={
                (200, "application/json"): _page_of(result, f"Usage{name}"),
                (200, "text/csv"): _CSV["text/csv"],
                **error_responses(),
            },
        )
    )


usage_embeddings = _usage("embeddings", EmbeddingsResultSerializer, "Embeddings")
usage_tensors = _usage("tensors", TensorsResultSerializer, "Tensors")
usage_completions = _usage("completions", CompletionsResultSerializer, "Completions")
costs = extend_schema_view(
    get=extend_schema(
        operation_id="usageCosts",
        summary="Costs of the tenant, in time buckets",
        tags=TAGS,
        parameters=[CostsQuerySerializer, *RESPONSE_HEADERS],
        responses={
            (200, "application/json"): _page_of(CostsResultSerializer, "Costs"),
            (200, "text/csv"): _CSV["text/csv"],
            **error_responses(),
        },
    )
)
