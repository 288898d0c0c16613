"""Output and error line shapes, as OpenAI's Batch API writes them."""

from __future__ import annotations

import hashlib
from typing import Any


def request_id(batch_id: str, line: int) -> str:
    """Stable across retries: a re-run shard writes the same ids, so nothing downstream sees two."""
    return hashlib.blake2b(f"{batch_id}:{line}".encode(), digest_size=12).hexdigest()


def output_record(batch_id: str, line: int, custom_id: str, body: dict[str, Any]) -> dict[str, Any]:
    rid = request_id(batch_id, line)
    return {
        "id": f"batch_req_{rid}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": rid, "body": body},
        "error": None,
    }


def failed_response_record(
    batch_id: str, line: int, custom_id: str, *, status_code: int, message: str, code: str, param: str | None = None
) -> dict[str, Any]:
    """The request was refused (its body, by its endpoint kind) or the model rejected it: a response with an
    error body, as the same request sent to the API would have got."""
    rid = request_id(batch_id, line)
    return {
        "id": f"batch_req_{rid}",
        "custom_id": custom_id,
        "response": {
            "status_code": status_code,
            "request_id": rid,
            "body": {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}},
        },
        "error": None,
    }


def error_record(batch_id: str, line: int, custom_id: str, *, code: str, message: str) -> dict[str, Any]:
    """The request never produced a response (cancelled, expired, gave up)."""
    return {
        "id": f"batch_req_{request_id(batch_id, line)}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }
