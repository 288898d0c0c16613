"""The API's JSON body parser: a size limit (413) and no body that makes the service answer 500.

DRF's own parser reads any size, lets a deeply nested body raise RecursionError and hands strings with
a NUL or a lone surrogate (``"\\ud800"``) to the services, where Postgres refuses them. Multipart
uploads are not parsed here: ``POST /v1/files`` keeps its own limit, ``FILE_MAX_BYTES``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from controlplane.core.http.errors import PayloadTooLarge
from controlplane.core.jsontext import MAX_JSON_DEPTH, bad_text, json_error_text, reject_constant, too_deep


def declared_length(meta: Mapping[str, Any]) -> int:
    """The request's declared ``Content-Length``; 0 when it is absent or malformed (``abc``, ``-5``), as
    Django's own request stream takes it: reads stop at the body limits whatever it says."""
    try:
        return max(0, int(meta.get("CONTENT_LENGTH") or 0))
    except ValueError:
        return 0


class LimitedJSONParser(JSONParser):
    """JSON bodies up to ``API_MAX_JSON_BYTES``; anything that is not storable JSON is a 400 parse error."""

    def parse(
        self, stream: IO[bytes], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        limit: int = settings.API_MAX_JSON_BYTES
        context = parser_context or {}
        request = context.get("request")
        declared = declared_length(request.META) if request is not None else 0
        # A declared length over the limit is refused unread; a chunked body is read one byte past it.
        raw = b"" if declared > limit else stream.read(limit + 1)
        if declared > limit or len(raw) > limit:
            raise PayloadTooLarge(
                f"The request body is larger than the {limit} byte limit for JSON bodies.",
                code="request_too_large",
            )
        if too_deep(raw):
            raise ParseError(f"JSON parse error - the body is nested more than {MAX_JSON_DEPTH} levels deep.")
        try:
            text = raw.decode(context.get("encoding", settings.DEFAULT_CHARSET))
            data = json.loads(text, parse_constant=reject_constant)
        except RecursionError as exc:  # unreachable under the depth check; kept so no body can be a 500
            raise ParseError("JSON parse error - the body is nested too deeply.") from exc
        except ValueError as exc:  # UnicodeDecodeError, JSONDecodeError, NaN, an integer with too many digits
            raise ParseError(f"JSON parse error - {json_error_text(exc)}.") from exc
        # Strict decoding refused encoded surrogates and JSON refuses raw control characters, so a lone
        # surrogate or a NUL can only come from a \\u escape.
        found = bad_text(data, reject_nul=True) if b"\\u" in raw else None
        if found is not None:
            path, what = found
            where = f" in {path[:200]!r}" if path else ""
            raise ParseError(
                f"JSON parse error - the body holds {what}{where}; text must be valid Unicode without NUL."
            )
        return data
