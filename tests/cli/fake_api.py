"""A tiny real HTTP server that answers like the service, for driving batchctl without the stack: the
openai SDK inside batchctl makes real requests to it, so headers, paths, bodies and error shapes are real."""

from __future__ import annotations

import json
import threading
from collections import defaultdict, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # JSON-able, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names in lower case
    body: bytes


class FakeAPI:
    """Scripted answers per (method, path); a path's last answer repeats. Unscripted paths are 404s in
    OpenAI's error shape, like the service's unmatched /v1 URLs."""

    def __init__(self) -> None:
        self.replies: dict[tuple[str, str], deque[Reply]] = defaultdict(deque)
        self.seen: list[Seen] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def on(self, method: str, path: str, *replies: Reply) -> None:
        self.replies[(method, "/v1" + path)].extend(replies)

    def requests(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path == "/v1" + path]

    def _answer(self, method: str, path: str) -> Reply:
        queue = self.replies.get((method, path))
        if not queue:
            message = f"Invalid URL ({method} {path})"
            return Reply(404, {"error": {"message": message, "type": "invalid_request_error", "code": None}})
        return queue.popleft() if len(queue) > 1 else queue[0]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {name.lower(): value for name, value in self.headers.items()}
                fake.seen.append(Seen(self.command, url.path, parse_qs(url.query), headers, body))
                reply = fake._answer(self.command, url.path)
                data = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                # Errors are final here: the SDK would otherwise retry a 409 or 5xx with backoff.
                headers = {"Content-Type": "application/json", "x-should-retry": "false", **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def __enter__(self) -> FakeAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def batch_json(
    batch_id: str = "batch_1",
    status: str = "in_progress",
    done: int = 0,
    failed: int = 0,
    total: int = 0,
    **fields: Any,
) -> dict[str, Any]:
    """A Batch object as the service renders it (OpenAI's fields plus priority, queue, rerun_of)."""
    body: dict[str, Any] = {
        "id": batch_id,
        "object": "batch",
        "endpoint": "/v2/infer",
        "model": "identity",
        "errors": None,
        "input_file_id": "file-in",
        "completion_window": "24h",
        "status": status,
        "output_file_id": None,
        "error_file_id": None,
        "created_at": 1764500000,
        "request_counts": {"total": total, "completed": done, "failed": failed},
        "metadata": None,
        "priority": "normal",
        "queue": None,
        "rerun_of": None,
    }
    body.update(fields)
    return body


def error_json(message: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
