"""The Django app served in-test by a fixed pool of threads, as gunicorn's gthread worker serves it: a
connection that arrives while every thread is busy waits for one. (pytest-django's live server starts a
thread per connection, so it cannot show a tenant holding every thread.)"""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from django.core.wsgi import get_wsgi_application
from django.db import connections


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class BoundedServer(WSGIServer):
    def __init__(self, *, threads: int):
        super().__init__(("127.0.0.1", 0), _QuietHandler)
        self.set_app(get_wsgi_application())
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="web")
        self._thread = threading.Thread(target=self.serve_forever, name="web-accept", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def process_request(self, request: socket.socket, client_address: Any) -> None:  # type: ignore[override]
        self._pool.submit(self._handle, request, client_address)

    def _handle(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001  # socketserver's own rule: report it and serve on
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            connections.close_all()  # this thread's; CONN_MAX_AGE would keep it past the test database

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self._pool.shutdown(wait=True, cancel_futures=True)
