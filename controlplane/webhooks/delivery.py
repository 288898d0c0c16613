"""One signed HTTP POST to a webhook endpoint (Standard Webhooks, as OpenAI sends them).

Headers: ``webhook-id`` (the delivery's id, the same on every attempt), ``webhook-timestamp`` (this
attempt's Unix time) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, one per
active secret, space separated), computed with the ``standardwebhooks`` package; the openai SDK's
``client.webhooks.unwrap(body, headers, secret=...)`` verifies them. The connection goes to the addresses that
urlguard checked just before, never to a second DNS answer; redirects are not followed (a 3xx is a failure).
One deadline bounds the whole attempt (resolve, connect, TLS, send, status line, headers, body excerpt):
Celery's thread pool ignores task time limits, so this is the only bound on how long an attempt holds a thread.
"""

from __future__ import annotations

import base64
import http.client
import io
import secrets
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from standardwebhooks import Webhook

from controlplane.core.http.errors import storable_text
from controlplane.webhooks.urlguard import Target, UnsafeUrl, UrlPolicy, target_resolve

USER_AGENT = "controlplane-webhooks/1"
# How much of a receiver's answer is read and kept for the delivery log: enough to see an error message.
RESPONSE_EXCERPT_BYTES = 1024
# Standard Webhooks recommends secrets of 24 to 64 bytes.
SECRET_BYTES = 32


def secret_new() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def signed_headers(*, signing_secrets: Sequence[str], webhook_id: str, body: str, at: datetime) -> dict[str, str]:
    """The request headers of one attempt, signed at ``at`` with each secret."""
    signature = " ".join(Webhook(secret).sign(webhook_id, at, body) for secret in signing_secrets)
    return {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str
    duration_ms: int
    response_excerpt: str = ""

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class DeadlinePassed(TimeoutError):
    """The attempt's overall deadline passed (connect, TLS, send, headers and body together)."""


class _Deadline:
    """One attempt's deadline on the monotonic clock: every blocking step gets only the time left."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlinePassed(f"timed out: the attempt's {self.seconds:g} s deadline passed")
        return left


class _DeadlineReader(socket.SocketIO):
    """The response's byte source: each read waits at most the deadline's remaining time. A per-read timeout
    alone never ends a receiver that trickles one byte every few seconds (each read succeeds). Counted as a
    reference to the socket, as socket.makefile's readers are: http.client closes the connection as soon as
    it has the headers of a ``Connection: close`` answer, and the socket must stay open for the body."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        super().__init__(sock, "rb")
        sock._io_refs += 1  # type: ignore[attr-defined]  # what socket.makefile does; SocketIO.close undoes it
        self._socket = sock
        self._deadline = deadline

    def readinto(self, buffer: Any) -> int | None:
        self._socket.settimeout(self._deadline.remaining())
        return super().readinto(buffer)


class _DeadlineSocket:
    """What http.client sees as the connection's socket: sends and reads bounded by the attempt's deadline.
    For TLS the wrapped socket is an SSLSocket, whose handshake, write and read each honour the timeout as
    a total over their retries, so the time left is a bound on each."""

    def __init__(self, sock: socket.socket, deadline: _Deadline):
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.remaining())
        self._sock.sendall(data)  # with a timeout, Python bounds the whole sendall by it (3.5+)

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        assert mode == "rb", mode  # http.client reads the response through this and nothing else
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        self._sock.close()


def _connect(addresses: Sequence[str], port: int, deadline: _Deadline) -> socket.socket:
    """A connection to the first of the checked addresses that answers (as create_connection does with a
    resolver's answers), and to no other."""
    error: OSError = OSError("no address")
    for address in addresses:
        try:
            return socket.create_connection((address, port), deadline.remaining())
        except DeadlinePassed:
            raise
        except OSError as exc:
            error = exc
    raise error


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Plain HTTP to the checked addresses; Host stays the URL's host."""

    def __init__(self, target: Target, deadline: _Deadline):
        super().__init__(target.host, target.port)
        self._addresses = target.addresses
        self._deadline = deadline

    def connect(self) -> None:
        self.sock = _DeadlineSocket(_connect(self._addresses, self.port, self._deadline), self._deadline)  # type: ignore[assignment]


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to the checked addresses, with SNI and certificate checks for the URL's host."""

    def __init__(self, target: Target, deadline: _Deadline):
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, context=self._tls)
        self._addresses = target.addresses
        self._deadline = deadline

    def connect(self) -> None:
        raw = _connect(self._addresses, self.port, self._deadline)
        raw.settimeout(self._deadline.remaining())  # bounds the whole handshake
        tls = self._tls.wrap_socket(raw, server_hostname=self.host)
        self.sock = _DeadlineSocket(tls, self._deadline)  # type: ignore[assignment]


def post(
    *, url: str, body: str, webhook_id: str, signing_secrets: Sequence[str], deadline_seconds: float, policy: UrlPolicy
) -> Outcome:
    """Resolve and check ``url``, then POST ``body`` signed now. Never raises for the receiver's faults:
    refusal, DNS, connection, TLS, timeout and protocol errors come back as ``Outcome.error``.
    ``deadline_seconds`` bounds the whole attempt, the DNS answer included: a receiver that trickles its
    answer, or a slow name server, is cut there, not at each read."""
    started = time.monotonic()
    deadline = _Deadline(deadline_seconds)

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        target = target_resolve(url, policy=policy, timeout=deadline_seconds)
    except UnsafeUrl as exc:
        return Outcome(status_code=None, error=exc.message, duration_ms=elapsed_ms())
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(target, deadline)
    # The real clock, whatever clock the caller schedules by: receivers refuse timestamps off by > 5 minutes.
    headers = signed_headers(signing_secrets=signing_secrets, webhook_id=webhook_id, body=body, at=datetime.now(UTC))
    try:
        connection.request("POST", target.path, body=body.encode(), headers=headers)
        response = connection.getresponse()
        excerpt = response.read(RESPONSE_EXCERPT_BYTES)
    except (OSError, http.client.HTTPException) as exc:  # timeouts and TLS errors are OSErrors too
        return Outcome(status_code=None, error=storable_text(f"{type(exc).__name__}: {exc}"), duration_ms=elapsed_ms())
    finally:
        connection.close()
    text = storable_text(excerpt.decode("utf-8", "replace"), RESPONSE_EXCERPT_BYTES)
    error = "" if 200 <= response.status < 300 else f"HTTP {response.status} {response.reason}"[:200]
    return Outcome(status_code=response.status, error=error, duration_ms=elapsed_ms(), response_excerpt=text)
