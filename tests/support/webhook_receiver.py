"""A real webhook receiver for the tests: an HTTP server on 127.0.0.1 in a thread of the test process."""

from __future__ import annotations

import ssl
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A held answer goes out after this long even if the test never releases it (a failed test must not leave the
# server thread waiting for ever).
HOLD_LIMIT_SECONDS = 120.0


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """Records every request (path, lower-cased headers, body). The first ``fail_first`` requests get
    ``fail_status``; every answer waits ``delay`` seconds first (a slow receiver), and until ``hold`` is set when
    given (a receiver that answers when the test says so; ``answered`` counts the answers sent); with ``trickle``
    the answer goes out one byte every ``trickle`` seconds (a receiver that never lets a per-read timeout fire)."""

    def __init__(
        self,
        *,
        fail_first: int = 0,
        fail_status: int = 500,
        delay: float = 0.0,
        hold: threading.Event | None = None,
        trickle: float | None = None,
        host: str = "127.0.0.1",
        tls: ssl.SSLContext | None = None,
    ):
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.delay = delay
        self.hold = hold
        self.answered = 0
        self.trickle = trickle
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.requests.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    failing = len(receiver.requests) <= receiver.fail_first
                time.sleep(receiver.delay)
                if receiver.hold is not None:
                    receiver.hold.wait(HOLD_LIMIT_SECONDS)
                status = receiver.fail_status if failing else 200
                payload = b'{"error": "not now"}' if failing else b"ok"
                if receiver.trickle is not None:
                    self._trickle(f"HTTP/1.1 {status} OK\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload)
                    return
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                with receiver._lock:
                    receiver.answered += 1

            def _trickle(self, answer: bytes) -> None:
                self.close_connection = True
                try:
                    for byte in answer:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(receiver.trickle or 0)
                except OSError:
                    pass  # the caller gave up: what it is for

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.scheme = "http"
        if tls is not None:  # HTTPS with the context's certificate
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
            self.scheme = "https"
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook-receiver", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{self.scheme}://{host}:{port}/hooks/openai?source=test"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.requests) >= count:
                    return list(self.requests)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.requests)} webhook requests after {timeout} s, expected {count}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
