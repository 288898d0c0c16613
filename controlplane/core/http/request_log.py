"""One log line per API request, with the ids it is about bound for everything the request logs: a request
id (the caller's ``X-Request-Id`` when it is sane, else a new one; echoed as ``x-request-id`` like OpenAI's
API), the batch or file id of the URL, and the id of a batch or file the request created."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponseBase

from controlplane.core.observability.logs import log_context_bind, log_context_clear

logger = logging.getLogger("controlplane.requests")

# A caller's id is kept only if it is short and plain: it goes into every log line of the request.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
# URL kwargs and created objects that name what a request is about.
_URL_IDS = ("batch_id", "file_id", "endpoint_id")
_OBJECT_IDS = {"batch": "batch_id", "file": "file_id"}


class RequestLogMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        given = request.headers.get("X-Request-Id", "")
        request_id = given if _REQUEST_ID.match(given) else f"req_{uuid.uuid4().hex}"
        log_context_clear()  # a gunicorn thread serves many requests
        log_context_bind(request_id=request_id)
        started = time.monotonic()
        try:
            response = self.get_response(request)
            self._bind_created(response)
            response["x-request-id"] = request_id
            if request.path.startswith("/v1/"):
                logger.info(
                    "%s %s %s %.0f ms",
                    request.method,
                    request.path,
                    response.status_code,
                    (time.monotonic() - started) * 1000,
                )
            return response
        finally:
            log_context_clear()

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        log_context_bind(**{name: kwargs[name] for name in _URL_IDS if isinstance(kwargs.get(name), str)})

    @staticmethod
    def _bind_created(response: HttpResponseBase) -> None:
        data = getattr(response, "data", None)  # DRF's Response: the object the view rendered
        if isinstance(data, dict) and (name := _OBJECT_IDS.get(str(data.get("object")))):
            log_context_bind(**{name: data.get("id")})
