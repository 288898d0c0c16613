"""``/v1/batches``: the request serializers the views validate with (core/http/input.py) and the OpenAPI
description built from them.

The response serializers only document: ``BatchSerializer`` mirrors ``render.batch_render`` (core/http/openapi.py
says why), and the fuzz test checks real responses against it."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers

from controlplane.batches import services
from controlplane.batches.intake.windows import parse_completion_window
from controlplane.batches.models import BatchStatus, Endpoint
from controlplane.core.http.idempotency import HEADER as IDEMPOTENCY_HEADER
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
from controlplane.core.http.pagination import CursorQuerySerializer
from controlplane.files.lifecycle import EXPIRES_AFTER_MAX_SECONDS, EXPIRES_AFTER_MIN_SECONDS, expires_after_parse
from controlplane.tenants.models import Priority
from controlplane.usage.schema import AmountSerializer

TAGS = ["Batches"]
_BATCH_ID = path_id("batch_id", "batch_abc123")
_PRIORITY_HELP = (
    "Extension: the scheduling class, up to the tenant's `max_priority` (a higher one is a 400); absent: the "
    "tenant's default. The openai SDK sends it with `extra_body={'priority': 'high'}`."
)


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {"type": "string", "maxLength": 512},
        "maxProperties": 16,
        "description": "Up to 16 key-value pairs; keys at most 64 characters, values strings of at most 512.",
    }
)
class MetadataField(serializers.DictField):
    """OpenAI's metadata, checked by the service's own rule (``services.metadata_validate``)."""

    def to_internal_value(self, data: Any) -> Any:
        return services.metadata_validate(data)


class OutputExpiresAfterSerializer(serializers.Serializer[Any]):
    anchor = serializers.ChoiceField(choices=["created_at"], help_text="The output files' creation time.")
    seconds = serializers.IntegerField(
        min_value=EXPIRES_AFTER_MIN_SECONDS,
        max_value=EXPIRES_AFTER_MAX_SECONDS,
        help_text="1 hour to 30 days after the anchor.",
    )


@extend_schema_field(OutputExpiresAfterSerializer)
class ExpiresAfterField(serializers.Field[Any, Any, Any, Any]):
    """``{"anchor": "created_at", "seconds": N}``, checked by files' rule (``expires_after_parse``: no
    unknown keys, no ``"3600"`` or ``true`` for a number), which names ``<field>.seconds`` when at fault."""

    def to_internal_value(self, data: Any) -> Any:
        expires_after_parse(data, param=self.field_name or "output_expires_after")
        return data


@extend_schema_field({"type": "string", "enum": list(settings.BATCH_COMPLETION_WINDOWS)})
class CompletionWindowField(serializers.Field[Any, Any, Any, Any]):
    """One of ``BATCH_COMPLETION_WINDOWS``, read when a request comes (the schema shows them at start-up)."""

    def to_internal_value(self, data: Any) -> str:
        parse_completion_window(data)
        return str(data)


class BatchCreateSerializer(serializers.Serializer[Any]):
    input_file_id = StrictCharField(help_text="A file uploaded with purpose `batch`.")
    endpoint = strict_choice(
        Endpoint.values,
        help_text="`/v1/embeddings`, `/v1/chat/completions`, `/v1/completions` or `/v1/responses` (a generation "
        "model), or `/v2/infer` for any catalogue model (a KServe v2 request per line).",
    )
    completion_window = CompletionWindowField(help_text="The windows in `BATCH_COMPLETION_WINDOWS`.")
    metadata = MetadataField(required=False, allow_null=True)
    priority = strict_choice(Priority.values, required=False, allow_null=True, help_text=_PRIORITY_HELP)
    output_expires_after = ExpiresAfterField(
        required=False, allow_null=True, help_text="When the output and error files expire; absent: kept until deleted."
    )


class BatchErrorSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()
    param = serializers.CharField(allow_null=True)
    line = serializers.IntegerField(allow_null=True, help_text="1-based line of the input file.")


class BatchErrorsSerializer(serializers.Serializer[Any]):
    object = serializers.ChoiceField(choices=["list"])
    data = BatchErrorSerializer(many=True)  # type: ignore[assignment]  # a field: DRF's metaclass pops it


class BatchRequestCountsSerializer(serializers.Serializer[Any]):
    total = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()


class InputTokensDetailsSerializer(serializers.Serializer[Any]):
    cached_tokens = serializers.IntegerField()


class OutputTokensDetailsSerializer(serializers.Serializer[Any]):
    reasoning_tokens = serializers.IntegerField()


class BatchUsageSerializer(serializers.Serializer[Any]):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()
    input_tokens_details = InputTokensDetailsSerializer()
    output_tokens_details = OutputTokensDetailsSerializer()


class BatchQueueSerializer(serializers.Serializer[Any]):
    position = serializers.IntegerField(help_text="1: the model's next free slot serves this batch.")
    runnable_batches = serializers.IntegerField()
    estimated_start_at = serializers.IntegerField(allow_null=True, help_text="Unix time of the next shard.")
    deadline_at_risk = serializers.BooleanField()


def _timestamp(help_text: str = "Unix time (seconds); null until then.") -> serializers.IntegerField:
    return serializers.IntegerField(allow_null=True, help_text=help_text)


class BatchSerializer(serializers.Serializer[Any]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=["batch"])
    endpoint = serializers.CharField()
    model = serializers.CharField(allow_null=True, help_text="The input's model, once validated.")
    errors = BatchErrorsSerializer(  # type: ignore[assignment]  # a field: DRF's metaclass pops it
        allow_null=True, help_text="Validation errors of a failed batch."
    )
    input_file_id = serializers.CharField()
    completion_window = serializers.CharField()
    status = serializers.ChoiceField(choices=BatchStatus.values)
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField(help_text="Unix time (seconds).")
    in_progress_at = _timestamp()
    expires_at = _timestamp("Unix time: created_at plus the completion window.")
    finalizing_at = _timestamp()
    completed_at = _timestamp()
    failed_at = _timestamp()
    expired_at = _timestamp()
    cancelling_at = _timestamp()
    cancelled_at = _timestamp()
    request_counts = BatchRequestCountsSerializer()
    usage = BatchUsageSerializer()
    metadata = MetadataField(allow_null=True)
    priority = serializers.ChoiceField(choices=Priority.values, help_text="Extension: the scheduling class.")
    queue = BatchQueueSerializer(
        allow_null=True,
        help_text="Extension: the batch's place in its model's queue; null when none of its work is waiting.",
    )
    cost = AmountSerializer(help_text="Extension: what the batch has been charged so far (the usage ledger).")
    trace_id = serializers.CharField(
        allow_null=True,
        help_text="Extension: the batch's OpenTelemetry trace id (32 hex digits): API, validation, each shard "
        "and its Triton calls, finalization, in the trace UI. Null when tracing was off when it was created.",
    )


BatchListSerializer = cursor_page_of(BatchSerializer, name="BatchList")


batch_list_create = extend_schema_view(
    get=extend_schema(
        operation_id="listBatches",
        summary="List the tenant's batches",
        tags=TAGS,
        parameters=[CursorQuerySerializer, *RESPONSE_HEADERS],
        responses={200: BatchListSerializer, **error_responses()},
    ),
    post=extend_schema(
        operation_id="createBatch",
        summary="Create a batch from an uploaded file",
        description="The batch starts in `validating`; a malformed input fails it later with line-numbered "
        "`errors`. Over a tenant quota (concurrent batches, enqueued lines) it is a 429 that names the limit.",
        tags=TAGS,
        request={"application/json": BatchCreateSerializer},
        parameters=[IDEMPOTENCY_KEY, REPLAYED, *RESPONSE_HEADERS],
        responses={200: BatchSerializer, **error_responses(404, 409, 413, 415)},
    ),
)


class BatchRerunSerializer(serializers.Serializer[Any]):
    error_codes = serializers.ListField(
        child=StrictCharField(),
        min_length=1,
        required=False,
        allow_null=True,
        help_text="Only the lines that failed with one of these codes; absent: every failed line.",
    )
    completion_window = CompletionWindowField(required=False, allow_null=True, help_text="Absent: the source's window.")


batch_detail = extend_schema_view(
    get=extend_schema(
        operation_id="retrieveBatch",
        summary="Retrieve a batch",
        tags=TAGS,
        parameters=[_BATCH_ID, *RESPONSE_HEADERS],
        responses={200: BatchSerializer, **error_responses(404)},
    ),
)

batch_cancel = extend_schema_view(
    post=extend_schema(
        operation_id="cancelBatch",
        summary="Cancel a batch",
        description="A validating batch is cancelled at once; an in-progress one moves to `cancelling`, keeps "
        "the lines already finished, and ends `cancelled` with its output and error files.",
        tags=TAGS,
        request=None,
        parameters=[_BATCH_ID, *RESPONSE_HEADERS],
        responses={
            200: BatchSerializer,
            **error_responses(404, described={409: "The batch has already ended (completed, failed or expired)."}),
        },
    ),
)

batch_rerun = extend_schema_view(
    post=extend_schema(
        operation_id="rerunBatch",
        summary="Re-run a finished batch's failed lines",
        description="Extension: a new batch over the failed lines of a completed, expired or cancelled batch "
        "(all of them, or those with the given error codes), with the source's endpoint, metadata, priority and "
        "output expiry. With the openai SDK: `client.post(f'/batches/{id}/rerun', body={}, cast_to=Batch)`.",
        tags=TAGS,
        request={"application/json": BatchRerunSerializer},
        parameters=[_BATCH_ID, IDEMPOTENCY_KEY, REPLAYED, *RESPONSE_HEADERS],
        responses={
            200: BatchSerializer,
            **error_responses(
                404,
                413,
                415,
                described={
                    409: "The batch is still open, has no failed lines (with those codes), or its input file was "
                    f"deleted; or the `{IDEMPOTENCY_HEADER}` was used with a different request."
                },
            ),
        },
    ),
)


class BatchResultsQuerySerializer(serializers.Serializer[Any]):
    """``GET /v1/batches/{id}/output`` and ``…/errors``: where to resume."""

    after = serializers.RegexField(
        r"^[0-9]{1,18}$",
        required=False,
        error_messages={"invalid": "expected a cursor: the X-Next-Cursor of an earlier response (digits)."},
        help_text="The `X-Next-Cursor` of the previous response; absent: from the first line. It counts the lines "
        "already received, so after a dropped connection pass the number of whole lines you kept.",
    )

    def validate_after(self, value: str) -> int:
        return int(value)


_RESULTS_HEADERS = [
    OpenApiParameter(name, str, OpenApiParameter.HEADER, response=[200, 302], description=description)
    for name, description in (
        ("X-Next-Cursor", "Pass it as `after` to get the lines that follow these."),
        ("X-Results-Complete", "`true` once the batch has ended and nothing follows; else `false`: poll again."),
        ("X-Batch-Status", "The batch's status when these lines were taken."),
    )
]


def _results_view(stream: str, file_field: str, operation_id: str) -> Any:
    return extend_schema_view(
        get=extend_schema(
            operation_id=operation_id,
            summary=f"Stream the batch's {stream} lines finished so far",
            description=f"Extension: JSONL, the same lines as the batch's `{file_field}` file and in its order, "
            "available while the batch runs: each response holds the lines that are final after `after` (those "
            "of shards that closed, up to the first still running) and ends; poll with its `X-Next-Cursor` until "
            "`X-Results-Complete` is `true`. Lines are never repeated or reordered between calls, and once the "
            f"batch has ended the stream from the start is the `{file_field}` file byte for byte. On S3 storage with "
            "FILE_DOWNLOAD_PRESIGNED_SECONDS set, an ended batch's stream from the start is a 302 to a presigned URL "
            "of that file, carrying the cursor headers itself (follow it without the API key). A validating "
            "batch streams nothing yet. With the openai SDK: `client.get(f'/batches/{id}/"
            f"{stream}', cast_to=httpx.Response, options={{'params': {{'after': cursor}}}})`, or "
            "`batchctl follow`.",
            tags=TAGS,
            parameters=[_BATCH_ID, BatchResultsQuerySerializer, *_RESULTS_HEADERS, *RESPONSE_HEADERS],
            responses={
                (200, "application/jsonl"): OpenApiResponse(
                    OpenApiTypes.BINARY,
                    description="One result object per line (the shape of the batch's result files).",
                ),
                302: OpenApiResponse(
                    description="An ended batch from the start (`after` absent or 0), on S3 storage with "
                    "FILE_DOWNLOAD_PRESIGNED_SECONDS set: Location is a presigned URL that serves the "
                    f"`{file_field}` file for that many seconds."
                ),
                **error_responses(
                    404,
                    described={409: f"The batch has ended and its `{file_field}` was deleted or has expired."},
                ),
            },
        ),
    )


batch_output = _results_view("output", "output_file_id", "streamBatchOutput")
batch_errors = _results_view("errors", "error_file_id", "streamBatchErrors")


def openapi_links(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook (SPECTACULAR_SETTINGS): from an upload to its batch, and from a
    batch to its files and further calls."""
    response_links_add(
        result,
        operation_id="createFile",
        links={
            "CreateBatch": {
                "operationId": "createBatch",
                "requestBody": {
                    "input_file_id": "$response.body#/id",
                    "endpoint": Endpoint.EMBEDDINGS.value,
                    "completion_window": settings.BATCH_COMPLETION_WINDOWS[0],
                },
                "description": "A batch over the uploaded file.",
            }
        },
    )
    batch_id = "$response.body#/id"
    input_file_id = "$response.body#/input_file_id"
    batch_links = {
        "RetrieveBatch": link("retrieveBatch", batch_id=batch_id, description="The batch's current state."),
        "CancelBatch": link("cancelBatch", batch_id=batch_id, description="Cancel it."),
        "RerunBatch": link("rerunBatch", batch_id=batch_id, description="Re-run its failed lines once it ended."),
        "ListBatchesAfter": link("listBatches", after=batch_id, description="The batches created before it."),
        "RetrieveInputFile": link("retrieveFile", file_id=input_file_id, description="Its input file."),
        "DeleteInputFile": link(
            "deleteFile", file_id=input_file_id, description="Refused (409) while the batch still runs."
        ),
    }
    response_links_add(result, operation_id="createBatch", links=batch_links)
    response_links_add(result, operation_id="cancelBatch", links=batch_links)
    return result
