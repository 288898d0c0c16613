"""The shipped nginx.conf run locally (deploy/local/proxy.py): the rendered file is the deployments' file but for
the addresses and paths a local run has, the real nginx binary accepts it, and it answers as the deployments'
does before any upstream is involved (the internal locations, the body size limit)."""

from __future__ import annotations

import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from deploy.local.proxy import NGINX_CONF, LocalProxy, ProxyConfigError, nginx_binary, nginx_conf_render
from tests.deploy.manifests import nginx_directives, nginx_parse, nginx_size


def _render(tmp_path: Path, text: str | None = None) -> str:
    return nginx_conf_render(
        upstream="127.0.0.1:18000",
        port=18080,
        fleet_port=18081,
        directory=tmp_path / "nginx",
        storage_root=tmp_path / "storage",
        text=text,
    )


def test_only_addresses_and_paths_differ_from_the_shipped_file(tmp_path):
    shipped, rendered = NGINX_CONF.read_text().splitlines(), _render(tmp_path).splitlines()
    assert len(shipped) == len(rendered)
    changed = {(a.strip(), b.strip()) for a, b in zip(shipped, rendered, strict=True) if a != b}
    local = tmp_path / "nginx"
    assert changed == {
        ("pid /tmp/nginx.pid;", f"pid {local}/nginx.pid;"),
        ("include /etc/nginx/mime.types;", f"include {local}/mime.types;"),
        ("include /etc/nginx/trusted-proxies/*.conf;", f"include {local}/trusted-proxies/*.conf;"),
        *{(f"{name} /tmp/nginx-{d};", f"{name} {local}/nginx-{d};") for name, d in _TEMP_PATHS},
        ("server web:8000;", "server 127.0.0.1:18000;"),
        ("listen 8080;", "listen 127.0.0.1:18080;"),
        ("listen 8081;", "listen 127.0.0.1:18081;"),
        ("alias /var/lib/controlplane/storage/;", f"alias {tmp_path / 'storage'}/;"),
    }


_TEMP_PATHS = [
    ("client_body_temp_path", "client-body"),
    ("proxy_temp_path", "proxy"),
    ("fastcgi_temp_path", "fastcgi"),
    ("uwsgi_temp_path", "uwsgi"),
    ("scgi_temp_path", "scgi"),
]


def test_a_shipped_line_that_changed_is_an_error_not_a_silent_difference(tmp_path):
    text = NGINX_CONF.read_text().replace("server web:8000;", "server web:9000;")
    with pytest.raises(ProxyConfigError, match="web:8000"):
        _render(tmp_path, text)


def test_nginx_accepts_the_rendered_file(tmp_path):
    directory = tmp_path / "nginx"
    directory.mkdir()
    (directory / "mime.types").write_text("types {}\n")
    conf = directory / "nginx.conf"
    conf.write_text(_render(tmp_path))
    result = subprocess.run(
        [str(nginx_binary()), "-t", "-p", f"{directory}/", "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "syntax is ok" in result.stderr


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_the_running_proxy_answers_as_the_deployments_do(tmp_path):
    dead_upstream = socket.socket()  # bound, never listening: connections to it are refused
    dead_upstream.bind(("127.0.0.1", 0))
    upstream = f"127.0.0.1:{dead_upstream.getsockname()[1]}"
    with dead_upstream, LocalProxy(upstream=upstream, storage_root=tmp_path, directory=tmp_path / "nginx") as proxy:
        proxy_port = proxy.port
        assert _status(f"{proxy.base_url}/internal/fleet/register") == 404  # not on the tenants' server
        assert _status(f"{proxy.base_url}/_protected_blobs/x") == 404  # internal: only X-Accel-Redirect reaches it
        assert _status(f"http://127.0.0.1:{proxy.fleet_port}/v1/batches") == 404  # the fleet's server: fleet only
        assert _status(f"{proxy.base_url}/v1/batches") == 502  # passed on, to an upstream that is not there
        # One byte over the limit, announced: refused from the headers, the body never read.
        [http] = nginx_directives(nginx_parse(NGINX_CONF.read_text()), "http")
        [limit] = nginx_directives(http[-1], "client_max_body_size")
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
            length = nginx_size(limit[1]) + 1
            client.sendall(f"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {length}\r\n\r\n".encode())
            assert client.recv(64).startswith(b"HTTP/1.1 413 ")
        log = proxy.log_path
    assert "client intended to send too large body" in log.read_text()
    with pytest.raises(OSError):  # stopped with the context: nothing listens there any more
        socket.create_connection(("127.0.0.1", proxy_port), timeout=2)


def test_a_handed_over_result_keeps_its_cursor_headers_and_a_file_download_gets_none(tmp_path):
    # nginx keeps only a few upstream headers across X-Accel-Redirect: the internal location sets the results
    # endpoint's again from the upstream's (controlplane/batches/views.py), and adds nothing where they are absent.
    import shutil
    import tempfile
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    storage = Path(tempfile.mkdtemp(prefix="storage-"))  # nginx's workers (nobody) must read it
    storage.chmod(0o755)
    (storage / "results").mkdir(mode=0o755)
    (storage / "results" / "out.jsonl").write_bytes(b'{"a": 1}\n{"b": 2}\n')
    (storage / "results" / "out.jsonl").chmod(0o644)

    class Upstream(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/jsonl")
            self.send_header("Content-Length", "0")
            self.send_header("X-Accel-Redirect", "/_protected_blobs/results/out.jsonl")
            if self.path.startswith("/v1/batches/"):
                self.send_header("X-Next-Cursor", "2")
                self.send_header("X-Results-Complete", "true")
                self.send_header("X-Batch-Status", "completed")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with LocalProxy(upstream=f"127.0.0.1:{server.server_address[1]}", storage_root=storage) as proxy:
            with urllib.request.urlopen(f"{proxy.base_url}/v1/batches/batch_x/output", timeout=10) as response:
                assert response.read() == b'{"a": 1}\n{"b": 2}\n'
                assert (
                    response.headers["X-Next-Cursor"],
                    response.headers["X-Results-Complete"],
                    response.headers["X-Batch-Status"],
                ) == ("2", "true", "completed")
            with urllib.request.urlopen(f"{proxy.base_url}/v1/files/file-x/content", timeout=10) as response:
                assert response.read() == b'{"a": 1}\n{"b": 2}\n'
                assert not {"X-Next-Cursor", "X-Results-Complete", "X-Batch-Status"} & set(response.headers)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(storage, ignore_errors=True)
