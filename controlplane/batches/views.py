from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.batches import schema, selectors, services
from controlplane.batches.models import Batch
from controlplane.batches.queue_info import batches_queue_info
from controlplane.batches.render import batch_render
from controlplane.batches.results.live import batch_results_slice
from controlplane.batches.results.rerun import batch_rerun_failed
from controlplane.core.http.idempotency import idempotency_key, idempotent, json_fingerprint
from controlplane.core.http.input import input_validate
from controlplane.core.http.negotiation import AnyAccept
from controlplane.core.http.pagination import CursorQuerySerializer, cursor_page
from controlplane.files.storage import blob_accel_target, blob_presigned_url
from controlplane.tenants.auth import request_tenant
from controlplane.usage.selectors import batch_costs


def _render_with_queue(batches: list[Batch]) -> list[dict[str, Any]]:
    """Batch objects with their queue positions, one ranking per model for the whole page."""
    queues = batches_queue_info(batches)
    costs = batch_costs(batch_ids=[batch.id for batch in batches])
    return [batch_render(batch, queue=queues.get(batch.id), cost=costs[batch.id]) for batch in batches]


@schema.batch_list_create
class BatchListCreateView(APIView):
    def get(self, request: Request) -> Response:
        query = input_validate(CursorQuerySerializer, request.query_params)
        page = cursor_page(selectors.batch_list(tenant=request_tenant(request)), **query, render=_render_with_queue)
        return Response(page)

    def post(self, request: Request) -> Response:
        body = input_validate(schema.BatchCreateSerializer, request.data)
        tenant = request_tenant(request)
        key = idempotency_key(request)

        def respond() -> Response:
            batch = services.batch_create(tenant=tenant, **body, api_key_id=getattr(request.auth, "id", None))
            return Response(batch_render(batch))

        fingerprint = json_fingerprint(request, request.data) if key is not None else ""
        return idempotent(tenant_id=tenant.id, key=key, fingerprint=fingerprint, respond=respond)


@schema.batch_detail
class BatchDetailView(APIView):
    def get(self, request: Request, batch_id: str) -> Response:
        [body] = _render_with_queue([selectors.batch_get(tenant=request_tenant(request), batch_id=batch_id)])
        return Response(body)


@schema.batch_cancel
class BatchCancelView(APIView):
    def post(self, request: Request, batch_id: str) -> Response:
        batch = selectors.batch_get(tenant=request_tenant(request), batch_id=batch_id)
        return Response(batch_render(services.batch_cancel(batch=batch)))


@schema.batch_rerun
class BatchRerunView(APIView):
    """``POST /v1/batches/{id}/rerun``: the failed lines of a finished batch as a new batch (an extension
    of the OpenAI API; with the openai SDK: ``client.post(f"/batches/{id}/rerun", body={}, cast_to=Batch)``).
    Optional body: ``error_codes`` (only lines that failed with one of them), ``completion_window``."""

    def post(self, request: Request, batch_id: str) -> Response:
        body = input_validate(schema.BatchRerunSerializer, request.data or {})
        tenant = request_tenant(request)
        batch = selectors.batch_get(tenant=tenant, batch_id=batch_id)
        key = idempotency_key(request)

        def respond() -> Response:
            rerun = batch_rerun_failed(
                batch=batch,
                actor=f"api key {getattr(request.auth, 'id', '?')}",
                **body,
                api_key_id=getattr(request.auth, "id", None),
            )
            return Response(batch_render(rerun))

        fingerprint = json_fingerprint(request, request.data or {}) if key is not None else ""
        return idempotent(tenant_id=tenant.id, key=key, fingerprint=fingerprint, respond=respond)


class _BatchResultsView(APIView):
    """``GET /v1/batches/{id}/output|errors?after=<cursor>``: the lines final so far, as JSONL (an extension;
    results/live.py says what is final). The cursor travels in headers, so the body stays the file's lines."""

    content_negotiation_class = AnyAccept
    stream = ""

    def get(self, request: Request, batch_id: str) -> HttpResponse | StreamingHttpResponse:
        query = input_validate(schema.BatchResultsQuerySerializer, request.query_params)
        batch = selectors.batch_get(tenant=request_tenant(request), batch_id=batch_id)
        results = batch_results_slice(batch=batch, stream=self.stream, after=query.get("after", 0))
        url = self._presigned_url(batch, results.whole_file)
        target = None if results.whole_file is None or url is not None else blob_accel_target(results.whole_file)
        response: HttpResponse | StreamingHttpResponse
        if url is not None:
            # All of an ended batch's file, sent by S3 as a file download is (files/views.py): the cursor's headers
            # ride on the redirect itself, where batchctl follow reads them (its redirect history).
            response = HttpResponseRedirect(url)
        elif target is not None:
            # All of an ended batch's file: sent by the reverse proxy, as a file download is (files/views.py);
            # deploy/k8s/base/nginx.conf sets the cursor's headers again from these.
            response = HttpResponse(content_type="application/jsonl")
            response["X-Accel-Redirect"] = target
        else:
            response = StreamingHttpResponse(results.chunks, content_type="application/jsonl")
        response["X-Next-Cursor"] = str(results.next_cursor)
        response["X-Results-Complete"] = "true" if results.complete else "false"
        response["X-Batch-Status"] = results.status
        # The lines grow while the batch runs; a redirect's URL is a short-lived credential for this one file.
        response["Cache-Control"] = "no-store"
        return response

    def _presigned_url(self, batch: Batch, whole_file: str | None) -> str | None:
        seconds = settings.FILE_DOWNLOAD_PRESIGNED_SECONDS
        if whole_file is None or not seconds:
            return None
        filename = f"{batch.id}_{self.stream}.jsonl"
        return blob_presigned_url(whole_file, filename=filename, content_type="application/jsonl", seconds=seconds)


@schema.batch_output
class BatchOutputView(_BatchResultsView):
    stream = "output"


@schema.batch_errors
class BatchErrorsView(_BatchResultsView):
    stream = "errors"
