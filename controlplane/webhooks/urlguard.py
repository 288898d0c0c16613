"""Where a webhook may go: public addresses only (no server-side request forgery into our network).

A URL is checked when an endpoint is registered and again before every attempt, and the attempt connects
to the address checked then (delivery.py): a host whose DNS answer changes to a private address after
registration (DNS rebinding) is refused at that attempt, not connected to. Only ports 80 and 443 are
allowed, and those in ``WEBHOOK_EXTRA_PORTS``: a webhook has no business knocking on a public host's SSH,
database or admin ports. ``WEBHOOK_ALLOW_LOOPBACK`` admits 127.0.0.0/8 and ::1 on any port, and nothing
else, for tests and the local runner (whose receivers listen on ephemeral ports)."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import socket
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from controlplane.core.http.errors import ValidationFailed, quote

# The longest URL accepted, as most browsers and proxies do.
MAX_URL_LENGTH = 2048
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Checked in this order, so an address gets its most specific name (127.0.0.1 is also "private").
_REFUSED = (
    ("is_loopback", "loopback"),
    ("is_unspecified", "unspecified"),
    ("is_link_local", "link-local"),
    ("is_multicast", "multicast"),
    ("is_private", "private"),
    ("is_reserved", "reserved"),
)
# Ranges that ``ipaddress`` calls global (or merely "reserved") but that lead into someone's network: the
# IPv6 transition prefixes embed an IPv4 address, so 2002:a00:1:: or 64:ff9b::a00:1 can reach 10.0.0.1 through
# a relay or NAT64 gateway; 192.0.0.0/24 holds protocol assignments (DS-Lite, NAT64 discovery, PCP anycast)
# of which Python deems some global; 168.63.129.16 is Azure's platform endpoint (DHCP, DNS, health, the
# guest agent), public-looking but answered by the host the service runs on.
_REFUSED_NETWORKS: tuple[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, str], ...] = (
    (ipaddress.ip_network("2002::/16"), "6to4"),
    (ipaddress.ip_network("64:ff9b::/96"), "NAT64"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "NAT64"),  # RFC 8215, the local-use NAT64 prefix
    (ipaddress.ip_network("2001::/32"), "Teredo"),  # embeds an IPv4 server and client address too
    (ipaddress.ip_network("192.0.0.0/24"), "IETF protocol assignment"),
    (ipaddress.ip_network("168.63.129.16/32"), "cloud platform"),
)

# Lookups in flight at once for deadline-bound resolution; more wait their turn (within their own deadline).
_RESOLVERS = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-dns")


class UnsafeUrl(ValidationFailed):
    code = "invalid_url"

    def __init__(self, message: str):
        super().__init__(message, param="url")


@dataclass(frozen=True)
class UrlPolicy:
    """What a webhook URL may name besides public addresses on ports 80 and 443."""

    allow_loopback: bool = False
    extra_ports: frozenset[int] = field(default_factory=frozenset)

    @classmethod
    def configured(cls) -> UrlPolicy:
        """The deployment's policy: WEBHOOK_ALLOW_LOOPBACK and WEBHOOK_EXTRA_PORTS."""
        return cls(allow_loopback=settings.WEBHOOK_ALLOW_LOOPBACK, extra_ports=frozenset(settings.WEBHOOK_EXTRA_PORTS))


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent in the request line
    addresses: tuple[str, ...]  # the checked addresses, the only ones to connect to, in resolver order


def address_refusal(address: str, *, allow_loopback: bool) -> str | None:
    """Why ``address`` is no place for a webhook (``"private"``, ``"link-local"``, …), or None."""
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    except ValueError:
        return "unparseable"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    if ip.is_loopback and allow_loopback:
        return None
    for network, name in _REFUSED_NETWORKS:
        if ip.version == network.version and ip in network:
            return name
    for attribute, reason in _REFUSED:
        if getattr(ip, attribute):
            return reason
    # Shared address space (100.64.0.0/10) and the like: neither private nor public.
    return None if ip.is_global else "non-global"


def url_check(url: object) -> tuple[str, str, int, str]:
    """(scheme, host, port, path) of a well-formed http(s) URL, or UnsafeUrl saying what is wrong."""
    if not isinstance(url, str) or not url:
        raise UnsafeUrl("url must be a non-empty string.")
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeUrl(f"url must be at most {MAX_URL_LENGTH} characters.")
    if any(ord(c) < 33 or ord(c) == 127 for c in url):
        raise UnsafeUrl("url must not contain spaces or control characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl(f"url is not a valid URL ({exc}): {quote(url)}.") from exc
    if parts.scheme not in _DEFAULT_PORTS:
        raise UnsafeUrl(f"url must start with https:// or http://, got {quote(url)}.")
    if not parts.hostname:
        raise UnsafeUrl(f"url has no host: {quote(url)}.")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("url must not carry credentials; authenticate the webhook by its signature.")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme], path


def _port_allowed(port: int, addresses: Collection[str], policy: UrlPolicy) -> bool:
    if port in _DEFAULT_PORTS.values() or port in policy.extra_ports:
        return True
    # Only reached when every address passed address_refusal, so with allow_loopback they may be loopback.
    return policy.allow_loopback and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def _getaddrinfo(host: str, port: int, timeout: float | None) -> list[Any]:
    """The resolver's answer, waited for at most ``timeout`` seconds. getaddrinfo cannot be interrupted, and a
    tenant's own name server decides how long it takes (glibc: up to 5 s × 2 tries per server), so it runs on a
    small pool whose threads finish on their own; the caller stops waiting at its deadline."""
    if timeout is None:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    future = _RESOLVERS.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError as exc:
        future.cancel()  # still queued behind slow lookups: it never runs
        raise OSError(f"no answer within {timeout:g} s") from exc


def target_resolve(url: object, *, policy: UrlPolicy, timeout: float | None = None) -> Target:
    """Check ``url`` and resolve its host (waiting at most ``timeout`` seconds for the answer); every address
    it resolves to must be public (a host with one private address among public ones could be steered to it)
    and the port one of 80, 443 or the policy's extras. Raises UnsafeUrl naming the reason."""
    allow_loopback = policy.allow_loopback
    scheme, host, port, path = url_check(url)
    try:
        infos = _getaddrinfo(host, port, timeout)
    except (OSError, UnicodeError, ValueError) as exc:  # gaierror is an OSError; an over-long label a UnicodeError
        raise UnsafeUrl(f"url: the host {quote(host)} could not be resolved ({exc}).") from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise UnsafeUrl(f"url: the host {quote(host)} has no address.")
    for address in addresses:
        reason = address_refusal(address, allow_loopback=allow_loopback)
        if reason is not None:
            article = "an" if reason[0].lower() in "aeiou" else "a"
            raise UnsafeUrl(
                f"url: the host {quote(host)} resolves to {address}, {article} {reason} address; webhooks are "
                "sent to public addresses only."
            )
    if not _port_allowed(port, addresses, policy):
        allowed = ", ".join(str(p) for p in sorted({*_DEFAULT_PORTS.values(), *policy.extra_ports}))
        raise UnsafeUrl(f"url: port {port} is not allowed for webhooks; use one of {allowed}.")
    return Target(scheme=scheme, host=host, port=port, path=path, addresses=tuple(addresses))
