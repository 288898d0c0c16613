"""``/v1/files``: the request serializers the views validate with (core/http/input.py) and the OpenAPI
description built from them. The response serializers only document (core/http/openapi.py says why):
``FileSerializer`` mirrors ``render.file_render``, and the fuzz test checks real responses against it."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import serializers

from controlplane.core.http.input import StrictCharField, strict_choice
from controlplane.core.http.openapi import (
    IDEMPOTENCY_KEY,
    REPLAYED,
    RESPONSE_HEADERS,
    cursor_page_of,
    error_responses,
    link,
    path_id,
    response_links_add,
)
from controlplane.core.http.pagination import CursorQuerySerializer, cursor_limit
from controlplane.files.lifecycle import EXPIRES_AFTER_MAX_SECONDS, EXPIRES_AFTER_MIN_SECONDS, expires_after_from_form
from controlplane.files.models import File

TAGS = ["Files"]
_FILE_ID = path_id("file_id", "file-abc123")
# A file listing's page size bound: a listing is cheap, OpenAI allows up to 10,000 too.
LIST_MAX_LIMIT = 10_000


class FileSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["file"])
    bytes = serializers.IntegerField(help_text="Size in bytes.")
    created_at = serializers.IntegerField(help_text="Unix time (seconds).")
    expires_at = serializers.IntegerField(allow_null=True, help_text="Unix time; null: kept until deleted.")
    filename = serializers.CharField()
    purpose = serializers.ChoiceField(
        choices=File.Purpose.choices, help_text="`batch` for uploads, `batch_output` for a batch's results."
    )
    status = serializers.ChoiceField(choices=["uploaded", "processed", "error"])
    status_details = serializers.CharField(allow_null=True)


FileListSerializer = cursor_page_of(FileSerializer, name="FileList")


class FileListQuerySerializer(CursorQuerySerializer):
    limit = cursor_limit(maximum=LIST_MAX_LIMIT)
    purpose = StrictCharField(required=False, allow_blank=True, help_text="Only files with this purpose.")


class DeletedFileSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["file"])
    deleted = serializers.BooleanField()


class FileUploadSerializer(serializers.Serializer[Any]):
    # The multipart form. expires_after comes as two fields, the way the openai SDK sends the object; their
    # names are no Python identifiers, hence get_fields. The domain's rule (lifecycle.expires_after_from_form)
    # checks them first, as a whole: it also refuses unknown expires_after[...] fields and a JSON
    # expires_after, and names the culprit `expires_after.seconds` as for a batch's output_expires_after.
    # (A comment, not a docstring: drf-spectacular would publish a docstring as the component's description.)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        expires_after = expires_after_from_form(data)
        values = super().to_internal_value(data)
        return {"file": values["file"], "purpose": values["purpose"], "expires_after": expires_after}

    def get_fields(self) -> dict[str, serializers.Field[Any, Any, Any, Any]]:
        return {
            # Empty files are accepted, as before: validation gives a batch over one its line-numbered answer.
            "file": serializers.FileField(allow_empty_file=True, help_text="The JSONL input: one request per line."),
            "purpose": strict_choice(["batch"]),
            "expires_after[anchor]": serializers.ChoiceField(
                choices=["created_at"], required=False, help_text="With `expires_after[seconds]`: the file expires."
            ),
            "expires_after[seconds]": serializers.IntegerField(
                min_value=EXPIRES_AFTER_MIN_SECONDS,
                max_value=EXPIRES_AFTER_MAX_SECONDS,
                required=False,
                help_text="Seconds after the upload (1 hour to 30 days); absent: kept until deleted.",
            ),
        }


file_list_create = extend_schema_view(
    get=extend_schema(
        operation_id="listFiles",
        summary="List the tenant's files",
        tags=TAGS,
        parameters=[FileListQuerySerializer, *RESPONSE_HEADERS],
        responses={200: FileListSerializer, **error_responses()},
    ),
    post=extend_schema(
        operation_id="createFile",
        summary="Upload a batch input file",
        description="Streams the upload to storage; over `FILE_MAX_BYTES` (1 GiB by default) it is a 413 and "
        "nothing is stored. Lines are checked when a batch is created from the file, not here.",
        tags=TAGS,
        request={"multipart/form-data": FileUploadSerializer},
        parameters=[IDEMPOTENCY_KEY, REPLAYED, *RESPONSE_HEADERS],
        responses={
            200: FileSerializer,
            **error_responses(
                409,
                415,
                described={
                    413: "Over `FILE_MAX_BYTES` (1 GiB by default), or larger than the tenant's whole storage "
                    "quota; nothing is stored.",
                    429: "Over the key's request rate, or the tenant's stored bytes plus this file are over its "
                    "storage quota (`error.limit`); delete files or wait for them to expire.",
                },
            ),
        },
    ),
)

file_detail = extend_schema_view(
    get=extend_schema(
        operation_id="retrieveFile",
        summary="Retrieve a file",
        tags=TAGS,
        parameters=[_FILE_ID, *RESPONSE_HEADERS],
        responses={200: FileSerializer, **error_responses(404)},
    ),
    delete=extend_schema(
        operation_id="deleteFile",
        summary="Delete a file",
        tags=TAGS,
        parameters=[_FILE_ID, *RESPONSE_HEADERS],
        responses={
            200: DeletedFileSerializer,
            **error_responses(404, described={409: "The file is the input of a batch that is still running."}),
        },
    ),
)

file_content = extend_schema_view(
    get=extend_schema(
        operation_id="downloadFile",
        summary="Download a file's content",
        description="The file's bytes, streamed: an input file as uploaded, or a batch's output or error "
        "file (one JSON result per line).",
        tags=TAGS,
        parameters=[_FILE_ID, *RESPONSE_HEADERS],
        responses={
            (200, "application/jsonl"): OpenApiResponse(OpenApiTypes.BINARY, description="The file's bytes."),
            302: OpenApiResponse(
                description="On S3 storage with FILE_DOWNLOAD_PRESIGNED_SECONDS set: Location is a presigned URL "
                "that serves the bytes for that many seconds (fetch it without the API key)."
            ),
            **error_responses(404),
        },
    ),
)


def openapi_links(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook (SPECTACULAR_SETTINGS): what an upload's id leads to."""
    file_id = "$response.body#/id"
    response_links_add(
        result,
        operation_id="createFile",
        links={
            "RetrieveFile": link("retrieveFile", file_id=file_id, description="The uploaded file."),
            "DownloadFile": link("downloadFile", file_id=file_id, description="Its content, as uploaded."),
            "DeleteFile": link("deleteFile", file_id=file_id, description="Delete it."),
            "ListFilesAfter": link("listFiles", after=file_id, description="The files uploaded before it."),
        },
    )
    return result
