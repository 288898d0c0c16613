"""One signed HTTP POST to a webhook endpoint (Standard Webhooks, as OpenAI sends them).

Headers: ``webhook-id`` (the delivery's id, the same on every attempt), ``webhook-timestamp`` (this
attempt's Unix time) and ``webhook-signature`` (``v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, one per
active secret, space separated), computed with the ``standardwebhooks`` package; the openai SDK's
``client.webhooks.unwrap(body, headers, secret=...)`` verifies them. The connection goes to the addresses that
urlguard checked just before, never to a second DNS answer; redirects are not followed (a 3xx is a failure).
"""

from __future__ import annotations

import base64
import http.client
import secrets
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from standardwebhooks import Webhook

from controlplane.core.errors import storable_text
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


def _connect(addresses: Sequence[str], port: int, timeout: float | None) -> socket.socket:
    """A connection to the first of the checked addresses that answers (as create_connection does with a
    resolver's answers), and to no other."""
    error: OSError = OSError("no address")
    for address in addresses:
        try:
            return socket.create_connection((address, port), timeout)
        except OSError as exc:
            error = exc
    raise error


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Plain HTTP to the checked addresses; Host stays the URL's host."""

    def __init__(self, target: Target, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._addresses = target.addresses

    def connect(self) -> None:
        self.sock = _connect(self._addresses, self.port, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """TLS to the checked addresses, with SNI and certificate checks for the URL's host."""

    def __init__(self, target: Target, timeout: float):
        self._tls = ssl.create_default_context()
        super().__init__(target.host, target.port, timeout=timeout, context=self._tls)
        self._addresses = target.addresses

    def connect(self) -> None:
        self.sock = self._tls.wrap_socket(_connect(self._addresses, self.port, self.timeout), server_hostname=self.host)


def post(
    *, url: str, body: str, webhook_id: str, signing_secrets: Sequence[str], timeout: float, policy: UrlPolicy
) -> Outcome:
    """Resolve and check ``url``, then POST ``body`` signed now. Never raises for the receiver's faults:
    refusal, DNS, connection, TLS, timeout and protocol errors come back as ``Outcome.error``. ``timeout``
    bounds the connect and each read (a receiver that trickles its answer is cut at the excerpt size)."""
    started = time.monotonic()

    def elapsed_ms() -> int:
        return int((time.monotonic() - started) * 1000)

    try:
        target = target_resolve(url, policy=policy)
    except UnsafeUrl as exc:
        return Outcome(status_code=None, error=exc.message, duration_ms=elapsed_ms())
    connection_class = _PinnedHTTPSConnection if target.scheme == "https" else _PinnedHTTPConnection
    connection = connection_class(target, timeout)
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
