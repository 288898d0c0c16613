"""A real S3-compatible server for the storage tests: moto's S3 server in a process of its own, reached
through a TCP proxy that counts the bytes the server sends, so a test can tell what a client really
downloaded (a ranged read must not fetch the whole object)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from controlplane.settings.storage import s3_storage_entry

# Smallest part S3 accepts; two in flight keep the upload memory tests' bound tight (~15 MiB).
S3_TEST_CHUNK_BYTES = 5 * 1024 * 1024
S3_TEST_CONCURRENCY = 2
_CREDENTIALS = {"access_key": "testing", "secret_key": "testing"}
_REGION = "us-east-1"


class ByteCountingProxy:
    """Forwards every connection to the server and counts the bytes coming back from it."""

    def __init__(self, target_port: int):
        self._target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._received = 0
        threading.Thread(target=self._accept, name="s3-proxy", daemon=True).start()

    @property
    def received(self) -> int:
        with self._lock:
            return self._received

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed at the end of the session
                return
            upstream = socket.create_connection(("127.0.0.1", self._target_port))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, count: bool) -> None:
        try:
            while data := source.recv(64 * 1024):
                if count:
                    with self._lock:
                        self._received += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # Either side ending ends the pair: the other pump's recv returns at once.
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()

    def close(self) -> None:
        self._listener.close()


@dataclass
class S3Server:
    process: subprocess.Popen[bytes]
    proxy: ByteCountingProxy
    log: Path

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=_REGION,
            aws_access_key_id=_CREDENTIALS["access_key"],
            aws_secret_access_key=_CREDENTIALS["secret_key"],
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto server did not listen on {port} within {timeout} s:\n{log.read_text()}")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (requirements.txt pins it)")
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out
        )
    proxy: ByteCountingProxy | None = None
    try:
        _wait_listening(port, process, log)
        proxy = ByteCountingProxy(port)
        yield S3Server(process=process, proxy=proxy, log=log)
    finally:
        if proxy is not None:
            proxy.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class S3Bucket:
    server: S3Server
    name: str
    client: Any

    def read(self, key: str) -> bytes:
        return bytes(self.client.get_object(Bucket=self.name, Key=key)["Body"].read())

    def keys(self) -> list[str]:
        listing = self.client.list_objects_v2(Bucket=self.name)
        return sorted(item["Key"] for item in listing.get("Contents", []))


@pytest.fixture
def s3_bucket(s3_server, settings, storage_dir) -> S3Bucket:
    """A fresh bucket on the moto server as the default storage, configured as settings/storage.py does for
    STORAGE_BACKEND=s3 (after the autouse local-storage fixture, so this one wins)."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    client = s3_server.client()
    client.create_bucket(Bucket=name)
    entry = s3_storage_entry(
        bucket=name,
        endpoint_url=s3_server.endpoint_url,
        region=_REGION,
        prefix="",
        chunk_bytes=S3_TEST_CHUNK_BYTES,
        concurrency=S3_TEST_CONCURRENCY,
    )
    entry["OPTIONS"].update(_CREDENTIALS)
    settings.STORAGES = {**settings.STORAGES, "default": entry}
    return S3Bucket(server=s3_server, name=name, client=client)


@pytest.fixture(params=["local", "s3"])
def any_storage(request) -> S3Bucket | None:
    """Runs a test once on local files and once on the S3 server (None for local)."""
    if request.param == "local":
        return None
    bucket: S3Bucket = request.getfixturevalue("s3_bucket")
    return bucket
