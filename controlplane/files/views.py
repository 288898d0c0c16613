from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import FileResponse, HttpResponse, HttpResponseRedirect
from django.utils.http import content_disposition_header
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.core.http.errors import PayloadTooLarge
from controlplane.core.http.idempotency import idempotency_key, idempotency_key_seen, idempotent, request_fingerprint
from controlplane.core.http.input import input_validate
from controlplane.core.http.negotiation import AnyAccept
from controlplane.core.http.pagination import cursor_page
from controlplane.core.http.parsers import LimitedJSONParser, declared_length
from controlplane.files import schema, selectors, services
from controlplane.files.quota import StorageRoom, storage_room
from controlplane.files.render import file_render
from controlplane.files.storage import READ_CHUNK_BYTES, blob_accel_target, blob_open, blob_presigned_url
from controlplane.files.uploads import ContentHashUploadHandler, SizeLimitUploadHandler
from controlplane.tenants.auth import request_tenant

# Room for the multipart framing and the small form fields around the file in a declared Content-Length.
_MULTIPART_SLACK = 64 * 1024


def _too_large() -> PayloadTooLarge:
    limit = settings.FILE_MAX_BYTES
    return PayloadTooLarge(f"File is larger than the {limit} byte limit; split it into several batches.", param="file")


@schema.file_list_create
class FileListCreateView(APIView):
    # The one view that parses multipart (settings.REST_FRAMEWORK says why), behind the size guard in post().
    # JSON stays so that a JSON body gets the "attach the file as multipart" 400 rather than a 415.
    parser_classes = (LimitedJSONParser, MultiPartParser)

    def get(self, request: Request) -> Response:
        query = input_validate(schema.FileListQuerySerializer, request.query_params)
        qs = selectors.file_list(tenant=request_tenant(request), purpose=query.pop("purpose", None))
        page = cursor_page(qs, **query, render=lambda files: [file_render(f) for f in files])
        return Response(page)

    def post(self, request: Request) -> Response:
        limit = settings.FILE_MAX_BYTES
        # Multipart framing adds a little; a declared length far above the limit is refused unread.
        declared = declared_length(request.META)
        if declared > limit + _MULTIPART_SLACK:
            raise _too_large()
        tenant = request_tenant(request)
        key = idempotency_key(request)
        # The storage quota (files/quota.py), checked unread from the declared length, then while the body
        # streams in; a replayed key skips both (its answer is the first one's, whatever is stored now).
        replay = key is not None and idempotency_key_seen(tenant_id=tenant.id, key=key)
        room = StorageRoom(quota=None, used=0) if replay else storage_room(tenant=tenant)
        room.check(max(0, declared - _MULTIPART_SLACK))
        guard = SizeLimitUploadHandler(request._request, max_bytes=room.read_limit(limit))
        handlers = request._request.upload_handlers
        # A list until the body is parsed (then Django freezes it); request.data below is the first read.
        assert isinstance(handlers, list)
        handlers.insert(0, guard)
        # With a key, the content is hashed as it streams in, for the fingerprint below.
        hasher = ContentHashUploadHandler(request._request) if key is not None else None
        if hasher is not None:
            handlers.insert(1, hasher)
        form = request.data  # the first read: the body streams in through the handlers above
        if guard.exceeded:
            if guard.received <= limit:
                room.check(guard.received)  # stopped at the quota: the file alone is over it (413)
            raise _too_large()
        body = input_validate(schema.FileUploadSerializer, form)
        upload, purpose, expires_after = body["file"], body["purpose"], body["expires_after"]
        room.check(upload.size)  # before it reaches storage; file_create checks again under a lock
        filename = upload.name or "upload.jsonl"

        def respond() -> Response:
            file = services.file_create(
                tenant=tenant,
                content=upload,
                filename=filename,
                purpose=purpose,
                size=upload.size,
                expires_after=expires_after,
            )
            return Response(file_render(file), status=200)

        fingerprint = ""
        if hasher is not None:
            # expires_after only when given, so keys stored before it existed still replay.
            expiry = () if expires_after is None else (f"expires_after={expires_after}",)
            fingerprint = request_fingerprint(
                "POST", request.path, purpose, filename, *expiry, hasher.hexdigest("file")
            )
        # The copy of up to FILE_MAX_BYTES runs outside any transaction (idempotency.py, its second protocol).
        return idempotent(tenant_id=tenant.id, key=key, fingerprint=fingerprint, respond=respond, claim_apart=True)


@schema.file_detail
class FileDetailView(APIView):
    def get(self, request: Request, file_id: str) -> Response:
        return Response(file_render(selectors.file_get(tenant=request_tenant(request), file_id=file_id)))

    def delete(self, request: Request, file_id: str) -> Response:
        file = selectors.file_get(tenant=request_tenant(request), file_id=file_id)
        services.file_delete(file=file)
        return Response({"id": file.id, "object": "file", "deleted": True})


class _BlobResponse(FileResponse):
    block_size = READ_CHUNK_BYTES  # the storage reader's own buffer size: one storage read per chunk sent


@schema.file_content
class FileContentView(APIView):
    content_negotiation_class = AnyAccept

    def get(self, request: Request, file_id: str) -> Any:
        file = selectors.file_get(tenant=request_tenant(request), file_id=file_id)
        presigned_seconds = settings.FILE_DOWNLOAD_PRESIGNED_SECONDS
        url = (
            blob_presigned_url(
                file.storage_name, filename=file.filename, content_type="application/jsonl", seconds=presigned_seconds
            )
            if presigned_seconds
            else None
        )
        if url is not None:
            # S3 sends the bytes, not a web thread (the tenant was checked above). The openai SDK follows the
            # redirect and, the origin being another, drops its Authorization header, as S3 requires.
            redirect = HttpResponseRedirect(url)
            redirect["Cache-Control"] = "no-store"  # the URL is a short-lived credential for this one file
            return redirect
        target = blob_accel_target(file.storage_name)
        if target is not None:
            # Behind the shipped nginx (deploy/nginx): it sends the blob from its internal location, and this
            # thread is free once the headers are out.
            handed = HttpResponse(content_type="application/jsonl")
            handed["Content-Disposition"] = content_disposition_header(False, file.filename) or "inline"
            handed["X-Accel-Redirect"] = target
            return handed
        # Streamed from storage chunk by chunk (S3: one GET whose body is read as it is sent on): a 1 GiB
        # result never sits in the web process's memory. The reader is not seekable, so FileResponse
        # cannot measure it; the length comes from storage.
        blob = blob_open(file.storage_name)
        response = _BlobResponse(blob, content_type="application/jsonl", filename=file.filename)
        response["Content-Length"] = str(blob.length)
        return response
