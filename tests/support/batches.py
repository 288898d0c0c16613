"""Builders of batch input: request lines, JSONL, uploaded files, a validated batch, the checked parse of an accepted
line, and a result file's records."""

from __future__ import annotations

import io
import json
from typing import Any

from controlplane.batches import services
from controlplane.batches.intake.requests import ModelResolver, parse_line
from controlplane.batches.models import Batch
from controlplane.files.models import File
from controlplane.files.services import file_create
from controlplane.files.storage import blob_open
from controlplane.kinds.base import ParsedLine
from controlplane.tenants.models import Tenant


def embedding_line(custom_id: str, text: str | list[str], model: str = "all-MiniLM-L6-v2", **body: Any) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": model, "input": text, **body},
    }


def tensor_line(custom_id: str, rows: list[list[float]], model: str = "identity") -> dict:
    flat = [v for row in rows for v in row]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v2/infer",
        "body": {
            "model": model,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(rows), len(rows[0])], "data": flat}],
        },
    }


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def upload(tenant: Tenant, content: bytes, name: str = "input.jsonl") -> File:
    return file_create(tenant=tenant, content=io.BytesIO(content), filename=name, purpose="batch", size=len(content))


def parse_accepted(raw: bytes, *, endpoint: str, resolver: ModelResolver) -> ParsedLine:
    """The checked parse of a line validation would accept: raises the LineIssue of an envelope problem, and
    the BodyIssue of a refused body (which the pipeline answers as a 400 line instead)."""
    parsed = parse_line(raw, endpoint=endpoint, resolver=resolver)
    if parsed.issue is not None:
        raise parsed.issue
    return parsed


def validated_batch(tenant: Tenant, lines: list[Any], *, endpoint: str) -> Batch:
    """``lines`` uploaded, a batch created on them and validated in this process; the batch as it is then."""
    file = upload(tenant, jsonl(lines))
    batch = services.batch_create(tenant=tenant, input_file_id=file.id, endpoint=endpoint, completion_window="24h")
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def file_records(file_id: str | None) -> list[dict]:
    """A stored JSONL file's records ([] for no file: a batch with no output or no errors has none)."""
    if file_id is None:
        return []
    with blob_open(File.objects.get(id=file_id).storage_name) as fh:
        return [json.loads(line) for line in fh]
