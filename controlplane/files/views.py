from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.http import FileResponse
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.errors import PayloadTooLarge, ValidationFailed
from controlplane.core.idempotency import idempotency_key, idempotent, request_fingerprint
from controlplane.core.pagination import cursor_page, parse_limit
from controlplane.files import selectors, services
from controlplane.files.serializers import file_render
from controlplane.files.storage import blob_open
from controlplane.files.uploads import ContentHashUploadHandler, SizeLimitUploadHandler
from controlplane.tenants.auth import request_tenant


def _too_large() -> PayloadTooLarge:
    limit = settings.FILE_MAX_BYTES
    return PayloadTooLarge(f"File is larger than the {limit} byte limit; split it into several batches.", param="file")


class FileListCreateView(APIView):
    def get(self, request: Request) -> Response:
        qs = selectors.file_list(tenant=request_tenant(request), purpose=request.query_params.get("purpose"))
        page = cursor_page(
            qs,
            after=request.query_params.get("after"),
            limit=parse_limit(request.query_params.get("limit"), maximum=10_000),
            render=lambda files: [file_render(f) for f in files],
        )
        return Response(page)

    def post(self, request: Request) -> Response:
        limit = settings.FILE_MAX_BYTES
        # Multipart framing adds a little; a declared length far above the limit is refused unread.
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
        if declared > limit + 64 * 1024:
            raise _too_large()
        key = idempotency_key(request)
        guard = SizeLimitUploadHandler(request._request, max_bytes=limit)
        handlers = request._request.upload_handlers
        # A list until the body is parsed (then Django freezes it); request.FILES below is the first read.
        assert isinstance(handlers, list)
        handlers.insert(0, guard)
        # With a key, the content is hashed as it streams in, for the fingerprint below.
        hasher = ContentHashUploadHandler(request._request) if key is not None else None
        if hasher is not None:
            handlers.insert(1, hasher)
        upload = request.FILES.get("file")
        if guard.exceeded:
            raise _too_large()
        purpose = request.data.get("purpose")
        if upload is None:
            raise ValidationFailed("Attach the JSONL file as multipart field 'file'.", param="file")
        if purpose != "batch":
            raise ValidationFailed(f"purpose must be 'batch', got {purpose!r}.", param="purpose")
        tenant = request_tenant(request)
        filename = upload.name or "upload.jsonl"

        def respond() -> Response:
            file = services.file_create(
                tenant=tenant, content=upload, filename=filename, purpose=purpose, size=upload.size
            )
            return Response(file_render(file), status=200)

        fingerprint = ""
        if hasher is not None:
            fingerprint = request_fingerprint("POST", request.path, purpose, filename, hasher.hexdigest("file"))
        return idempotent(tenant_id=tenant.id, key=key, fingerprint=fingerprint, respond=respond)


class FileDetailView(APIView):
    def get(self, request: Request, file_id: str) -> Response:
        return Response(file_render(selectors.file_get(tenant=request_tenant(request), file_id=file_id)))

    def delete(self, request: Request, file_id: str) -> Response:
        file = selectors.file_get(tenant=request_tenant(request), file_id=file_id)
        services.file_delete(file=file)
        return Response({"id": file.id, "object": "file", "deleted": True})


class _AnyAccept(BaseContentNegotiation):
    """File content is bytes whatever the client accepts (the openai SDK asks for application/binary)."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> BaseParser | None:
        return next(iter(parsers))

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class FileContentView(APIView):
    content_negotiation_class = _AnyAccept

    def get(self, request: Request, file_id: str) -> Any:
        file = selectors.file_get(tenant=request_tenant(request), file_id=file_id)
        # FileResponse streams in chunks: a 1 GiB result never sits in the web process's memory.
        return FileResponse(blob_open(file.storage_name), content_type="application/jsonl", filename=file.filename)
