"""The slowloris attacker and the watch on gunicorn's port (tests/chaos/test_slowloris.py).

Two kinds of slow client, on one asyncio loop so hundreds cost one thread:
- ``header``: the request line and a few headers at once, then one more header byte every few seconds, never the
  blank line that ends the header; when the proxy drops it, it connects again (as slowloris does) until told to
  stop. nginx's ``client_header_timeout`` bounds the whole header, counted from the connection.
- ``body``: complete, valid headers of a JSON POST with a Content-Length, then a few body bytes, one every few
  seconds, then silence. nginx's ``client_body_timeout`` bounds the pause between two reads of the body.
- ``upload``: the headers of an authenticated 1 GiB upload (POST /v1/files), then a byte every few seconds.
  nginx lets a bounded number of uploads in at once (nginx.conf's uploads budget) and answers the rest 429.
Each connection records when it opened, when it last sent a byte and when it saw the proxy close it (EOF or a
reset), and whatever the proxy answered before closing. Each slow client connects from its own loopback address
(127.10.0.0/16 and up), as an attack from many hosts does: the proxy's per-address connection limit would
otherwise answer most of them 429 at once (that limit's own test: tests/deploy/test_edge_limits.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass


@dataclass
class SlowConnection:
    kind: str
    request_id: str
    opened: float  # time.monotonic() as the connect began
    last_sent: float  # as the last write began
    closed: float | None = None  # None: still open when the attack gave up on it
    answer: bytes = b""

    def held_s(self, timeout_s: float) -> float | None:
        """How long past the configured timeout the proxy kept it: the header's deadline counts from the
        connection, the body's from the last byte sent."""
        if self.closed is None:
            return None
        start = self.opened if self.kind == "header" else self.last_sent
        return self.closed - start - timeout_s


@dataclass(frozen=True)
class Attack:
    port: int
    api_key: str
    header_clients: int
    body_clients: int
    drip_interval_s: float
    body_drips: int
    # How long to wait, past a connection's timeout, for the proxy to close it before recording it as open.
    give_up_after_s: float
    upload_clients: int = 0

    def run(self, header_timeout_s: float, body_timeout_s: float) -> list[SlowConnection]:
        return asyncio.run(self._run(header_timeout_s, body_timeout_s))

    async def _run(self, header_timeout_s: float, body_timeout_s: float) -> list[SlowConnection]:
        done: list[SlowConnection] = []
        stop = asyncio.Event()
        bodies = [
            asyncio.create_task(self._body(i, body_timeout_s + self.give_up_after_s, done))
            for i in range(self.body_clients)
        ]
        headers = [
            asyncio.create_task(self._headers(i, header_timeout_s + self.give_up_after_s, stop, done))
            for i in range(self.header_clients)
        ]
        uploads = [
            asyncio.create_task(self._upload(i, body_timeout_s + self.give_up_after_s, done))
            for i in range(self.upload_clients)
        ]
        await asyncio.gather(*bodies, *uploads)
        stop.set()  # the header clients finish the connection they hold and stop reconnecting
        await asyncio.gather(*headers)
        return done

    def _head(self, method: str, request_id: str) -> bytes:
        return (
            f"{method} /v1/batches HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Authorization: Bearer {self.api_key}\r\nX-Request-Id: {request_id}\r\n"
        ).encode()

    async def _headers(self, index: int, wait_s: float, stop: asyncio.Event, done: list[SlowConnection]) -> None:
        attempt = 0
        while not stop.is_set():
            request_id = f"slowloris-h{index}-{attempt}"
            drip = b"X-Slowloris: " + b"a" * 10_000  # never the blank line that ends the header
            done.append(await self._slow("header", request_id, self._head("GET", request_id), drip, wait_s, index))
            attempt += 1

    async def _body(self, index: int, wait_s: float, done: list[SlowConnection]) -> None:
        request_id = f"slowloris-b{index}"
        body = b'{"input_file_id": "file-slowloris", "endpoint": "/v2/infer", "completion_window": "24h"}'
        head = (
            self._head("POST", request_id)
            + (f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        )
        done.append(await self._slow("body", request_id, head, body[: self.body_drips], wait_s, index))

    async def _upload(self, index: int, wait_s: float, done: list[SlowConnection]) -> None:
        # Arriving a fifth of a second apart, as trickling clients do: each one's key check is a quick request to
        # gunicorn (nginx's auth subrequest); twenty at the same instant would count as a burst of API calls.
        await asyncio.sleep(index * 0.2)
        request_id = f"trickle-u{index}"  # its key check reaches gunicorn, its body never does
        head = (
            f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nAuthorization: Bearer {self.api_key}\r\n"
            f"X-Request-Id: {request_id}\r\nContent-Type: multipart/form-data; boundary=x\r\n"
            f"Content-Length: {1024**3}\r\n\r\n"
        ).encode()
        done.append(await self._slow("upload", request_id, head, b"--x\r\n"[: self.body_drips], wait_s, index))

    async def _slow(
        self, kind: str, request_id: str, head: bytes, drip: bytes, wait_s: float, index: int = 0
    ) -> SlowConnection:
        # Stamped before the connect and before each write, never after: with hundreds of connections on one
        # loop on a busy host, the loop may resume here late, and a late stamp would make nginx's close look early.
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, local_addr=(source(kind, index), 0))
        conn = SlowConnection(kind, request_id, opened=started, last_sent=started)
        reading = asyncio.create_task(_read_until_closed(reader, conn))
        try:
            conn.last_sent = time.monotonic()
            writer.write(head)
            await writer.drain()
            for byte in drip:
                finished, _ = await asyncio.wait({reading}, timeout=self.drip_interval_s)
                if finished or time.monotonic() - conn.opened > wait_s:
                    break
                conn.last_sent = time.monotonic()
                writer.write(bytes([byte]))
                await writer.drain()
            await asyncio.wait({reading}, timeout=wait_s)
        except OSError:  # a write into a connection the proxy has closed: the read sees the close as well
            await asyncio.wait({reading}, timeout=1)
        finally:
            if not reading.done():
                reading.cancel()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        return conn


_KIND_NETWORKS = {"header": 10, "body": 11, "upload": 12}


def source(kind: str, index: int) -> str:
    """The loopback address slow client ``index`` of ``kind`` connects from: one of its own (Linux routes all of
    127.0.0.0/8 to lo)."""
    return f"127.{_KIND_NETWORKS[kind]}.{index // 250}.{index % 250 + 1}"


async def _read_until_closed(reader: asyncio.StreamReader, conn: SlowConnection) -> None:
    try:
        while chunk := await reader.read(65536):
            conn.answer += chunk
    except OSError:
        pass  # reset by the proxy: closed just the same
    conn.closed = time.monotonic()


class PortWatch:
    """Samples the established TCP connections to one local port (/proc/net/tcp, every ``interval_s``): the
    connections that reached gunicorn, whether its threads have taken them yet or they wait in its backlog."""

    def __init__(self, port: int, interval_s: float = 0.1) -> None:
        self.port = port
        self.interval_s = interval_s
        self.peaks: dict[str, int] = {}
        self.phase = "start"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="port-watch", daemon=True)

    def established(self) -> int:
        local = f":{self.port:04X}"
        count = 0
        with open("/proc/net/tcp") as table:
            next(table)
            for row in table:
                fields = row.split()
                count += fields[1].endswith(local) and fields[3] == "01"  # 01: ESTABLISHED
        return count

    def _run(self) -> None:
        while not self._stop.is_set():
            phase, now = self.phase, self.established()
            self.peaks[phase] = max(self.peaks.get(phase, 0), now)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PortWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
