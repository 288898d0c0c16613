"""``/v1/organization/usage/{embeddings,tensors,completions}`` and ``/v1/organization/costs``: the asking tenant's
ledger in OpenAI's organization usage shapes, as JSON or as CSV (``Accept: text/csv`` or ``?format=csv``)."""

from __future__ import annotations

import csv
import io
from typing import Any

from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.http.input import input_validate
from controlplane.tenants.auth import request_tenant
from controlplane.usage import schema
from controlplane.usage.reports import cost_report, usage_report

CSV_COLUMNS = (
    "start_time",
    "end_time",
    "start_time_iso",
    "end_time_iso",
    "model",
    "api_key_id",
    "batch_id",
    "line_item",
    "input_tokens",
    "input_cached_tokens",
    "output_tokens",
    "rows",
    "num_model_requests",
    "compute_seconds",
    "amount",
    "currency",
)


class CSVRenderer(BaseRenderer):
    """One CSV row per bucket result; the page's ``next_page`` goes to the ``X-Next-Page`` header."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for bucket in data.get("data", []):
            for result in bucket["results"]:
                row = {key: bucket[key] for key in ("start_time", "end_time", "start_time_iso", "end_time_iso")}
                row.update(result)
                if "amount" in result:
                    row["amount"], row["currency"] = result["amount"]["exact"], result["amount"]["currency"]
                writer.writerow(row)
        return out.getvalue().encode()


class _ReportView(APIView):
    renderer_classes = (JSONRenderer, CSVRenderer)

    def perform_content_negotiation(self, request: Request, force: bool = False) -> tuple[Any, str]:
        # ``?format=csv`` for links and browsers (the API turns DRF's own format override off).
        if request.query_params.get("format") == "csv":
            return CSVRenderer(), CSVRenderer.media_type
        return super().perform_content_negotiation(request, force)

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(response, Response) and response.status_code >= 400:
            # Errors stay in OpenAI's JSON shape whatever the client asked for.
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), "application/json"
        response = super().finalize_response(request, response, *args, **kwargs)
        if isinstance(response, Response) and isinstance(response.data, dict) and response.data.get("next_page"):
            response["X-Next-Page"] = response.data["next_page"]
        return response


@schema.usage_embeddings
class UsageEmbeddingsView(_ReportView):
    def get(self, request: Request) -> Response:
        query = input_validate(schema.UsageQuerySerializer, request.query_params)
        return Response(usage_report(tenant_id=request_tenant(request).id, **query, kind="embeddings"))


@schema.usage_tensors
class UsageTensorsView(_ReportView):
    def get(self, request: Request) -> Response:
        query = input_validate(schema.UsageQuerySerializer, request.query_params)
        return Response(usage_report(tenant_id=request_tenant(request).id, **query, kind="tensors"))


@schema.usage_completions
class UsageCompletionsView(_ReportView):
    def get(self, request: Request) -> Response:
        query = input_validate(schema.UsageQuerySerializer, request.query_params)
        return Response(usage_report(tenant_id=request_tenant(request).id, **query, kind="completions"))


@schema.costs
class CostsView(_ReportView):
    def get(self, request: Request) -> Response:
        query = input_validate(schema.CostsQuerySerializer, request.query_params)
        return Response(cost_report(tenant_id=request_tenant(request).id, **query))
