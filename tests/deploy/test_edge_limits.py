"""The edge's limits, with the real nginx binary and the shipped nginx.conf (deploy/local/proxy.py) in front of a
small recording upstream: body limits per route, the API key checked before an upload's body is read,
connection and request budgets per client address, and the client's address taken from a trusted proxy only.

The upstream stands in for gunicorn (it answers nginx's auth subrequest as the real check does:
tests/tenants/test_edge_auth.py tests that view, and the chaos stack runs the real one behind this proxy)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deploy.local.proxy import LocalProxy

GOOD_KEY = "Bearer good-key"
GIB = 1024**3


class _Upstream(BaseHTTPRequestHandler):
    """Answers nginx's auth subrequest like controlplane.tenants.views.edge_auth, everything else with the
    request's path and headers as JSON; records what reached it."""

    seen: list[tuple[str, str, dict[str, str]]]

    def _answer(self) -> None:
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.seen.append((self.command, self.path, headers))
        if self.path == "/internal/edge/auth":
            self.send_response(204 if headers.get("authorization") == GOOD_KEY else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        length = int(headers.get("content-length") or 0)
        self.rfile.read(length)
        body = json.dumps({"path": self.path, "headers": headers}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def upstream() -> Iterator[tuple[str, list]]:
    seen: list[tuple[str, str, dict[str, str]]] = []
    handler = type("Recording", (_Upstream,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def _proxy(tmp_path: Path, address: str, **kwargs) -> LocalProxy:
    # Its own fresh directory under /tmp (the default): nginx's workers, run as nobody under root, can enter it.
    return LocalProxy(upstream=address, storage_root=tmp_path, **kwargs)


def _raw(port: int, request: bytes, *, source: str = "127.0.0.1", read: int = 4096) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as client:
        client.sendall(request)
        return client.recv(read)


def _get(url: str, *, source: str = "127.0.0.1", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    host, port = url.split("//")[1].split("/")[0].split(":")
    path = "/" + url.split("//")[1].split("/", 1)[1]
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    answer = b""
    with socket.create_connection((host, int(port)), timeout=10, source_address=(source, 0)) as client:
        client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        while chunk := client.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_small_bodies_everywhere_but_uploads(tmp_path, upstream):
    address, seen = upstream
    with _proxy(tmp_path, address) as proxy:
        five_mib = 5 * 1024 * 1024
        answer = _raw(
            proxy.port, f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nContent-Length: {five_mib}\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_too_large"
        # The same size is an upload's to send: with a key, nginx starts reading it (100 Continue is not asked
        # for, so it waits for the body) instead of refusing.
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            client.sendall(
                f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {GOOD_KEY}\r\n"
                f"Content-Length: {five_mib}\r\n\r\n".encode()
                + b"x" * five_mib
            )
            assert client.recv(64).startswith(b"HTTP/1.1 200 ")
    assert [(method, path) for method, path, _ in seen] == [("GET", "/internal/edge/auth"), ("POST", "/v1/files")]


def test_an_upload_without_a_usable_key_is_refused_before_its_body_is_read(tmp_path, upstream):
    address, seen = upstream
    with _proxy(tmp_path, address) as proxy:
        for auth in ("", "Authorization: Bearer wrong\r\n"):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
                # A 1 GiB body announced, not one byte of it sent: the answer comes from the headers alone.
                client.sendall(f"POST /v1/files HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {GIB}\r\n\r\n".encode())
                client.settimeout(5)
                answer = client.recv(4096)
            assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["code"] == "invalid_api_key"
        bodies = proxy.directory / "nginx-client-body"
        assert not bodies.exists() or not any(bodies.rglob("*[0-9]"))
    assert {path for _, path, _ in seen} == {"/internal/edge/auth"}  # the uploads never reached the upstream


def _slow_upload(port: int, source: str, opened: list[socket.socket]) -> None:
    client = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    client.sendall(
        f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {GOOD_KEY}\r\nContent-Length: {GIB}\r\n\r\n".encode()
    )
    client.sendall(b"x" * 1024)
    opened.append(client)


def test_uploads_have_a_budget_per_client_and_in_all(tmp_path, upstream):
    address, _ = upstream
    opened: list[socket.socket] = []
    with _proxy(tmp_path, address) as proxy:
        try:
            for _ in range(2):  # the per-client budget: two uploads at once
                _slow_upload(proxy.port, "127.0.0.2", opened)
            time.sleep(0.3)  # nginx has counted them (the auth subrequest answered, the body being read)
            answer = _raw(
                proxy.port,
                f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {GOOD_KEY}\r\nContent-Length: 10\r\n\r\n0123456789".encode(),
                source="127.0.0.2",
            )
            assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
            assert b"Retry-After: 1" in answer
            # Another address still uploads, until eight are in flight in all.
            for source in ("127.0.0.3", "127.0.0.3", "127.0.0.4", "127.0.0.4", "127.0.0.5", "127.0.0.5"):
                _slow_upload(proxy.port, source, opened)
            time.sleep(0.3)
            answer = _raw(
                proxy.port,
                f"POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: {GOOD_KEY}\r\nContent-Length: 10\r\n\r\n0123456789".encode(),
                source="127.0.0.6",
            )
            assert answer.startswith(b"HTTP/1.1 429 "), answer[:200]
            # Listing files is not an upload: it is not counted against either budget.
            listing = _get(f"{proxy.base_url}/v1/files", source="127.0.0.6", headers={"Authorization": GOOD_KEY})
            assert listing[0] == 200
        finally:
            for client in opened:
                client.close()


def test_requests_per_client_are_limited_and_other_clients_are_not(tmp_path, upstream):
    """A burst of 200 passes, then 50 a second: eight clients on one address send until they are well past what
    that allows for the time they took (a loaded host sends slower, and is simply given more time)."""
    address, _ = upstream
    statuses: list[int] = []
    with _proxy(tmp_path, address) as proxy:
        started = time.monotonic()

        def allowed() -> float:
            return 200 + 50 * (time.monotonic() - started)

        def client() -> None:
            while len(statuses) < allowed() + 100 and time.monotonic() - started < 60:
                statuses.append(_get(f"{proxy.base_url}/v1/batches", source="127.0.0.7")[0])

        threads = [threading.Thread(target=client) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        passed = statuses.count(200)
        assert statuses.count(429) > 0 and set(statuses) == {200, 429}
        assert 200 <= passed <= allowed() + 8, (passed, len(statuses), time.monotonic() - started)
        status, body = _get(f"{proxy.base_url}/v1/batches", source="127.0.0.7")
        if status == 429:
            assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
        assert _get(f"{proxy.base_url}/v1/batches", source="127.0.0.8")[0] == 200


def _seen_address(proxy: LocalProxy, forwarded: str) -> str:
    status, body = _get(f"{proxy.base_url}/v1/batches", headers={"X-Forwarded-For": forwarded})
    assert status == 200
    return json.loads(body)["headers"]["x-real-ip"]


def test_the_client_address_comes_from_trusted_proxies_only(tmp_path, upstream):
    address, _ = upstream
    with _proxy(tmp_path, address) as proxy:  # no proxy trusted: the TCP peer, whatever the header says
        assert _seen_address(proxy, "203.0.113.9") == "127.0.0.1"
    with _proxy(tmp_path, address, trusted_proxies=("127.0.0.1",)) as proxy:
        assert _seen_address(proxy, "203.0.113.9") == "203.0.113.9"
        # An address the client put in front of the chain is not believed: the last untrusted one counts.
        assert _seen_address(proxy, "198.51.100.1, 203.0.113.9") == "203.0.113.9"
