"""The webhook URL guard's ports and the ranges Python's ``ipaddress`` calls global but that lead into a
network (6to4, NAT64, Teredo, 192.0.0.0/24, Azure's 168.63.129.16): refused at registration and, when a
host's DNS answer moves there afterwards (rebinding), at the attempt, without connecting."""

from __future__ import annotations

import socket

import pytest
from django.utils import timezone

from controlplane.webhooks import attempts, services
from controlplane.webhooks.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from controlplane.webhooks.urlguard import UrlPolicy, address_refusal, target_resolve

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.216.34"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("2002:a00:1::1", "6to4"),  # 6to4 of 10.0.0.1
        ("2002:808:808::1", "6to4"),  # even of a public IPv4: the relay is not ours to choose
        ("64:ff9b::a00:1", "NAT64"),
        ("64:ff9b::808:808", "NAT64"),
        ("64:ff9b:1::1", "NAT64"),
        ("2001:0:808:808::1", "Teredo"),
        ("192.0.0.9", "IETF protocol assignment"),  # Python deems this one global
        ("192.0.0.170", "IETF protocol assignment"),
        ("::ffff:192.0.0.9", "IETF protocol assignment"),
        ("168.63.129.16", "cloud platform"),
    ],
)
def test_transition_and_platform_ranges_are_refused(address, reason):
    assert address_refusal(address, allow_loopback=True) == reason


def test_public_addresses_next_to_the_refused_ranges_pass():
    for address in ("192.0.1.1", "168.63.129.17", "2003::1", "2600::1", PUBLIC):
        assert address_refusal(address, allow_loopback=False) is None, address


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[2002:a00:1::1]/hook", "a 6to4 address"),
        ("https://[64:ff9b::a00:1]/hook", "a NAT64 address"),
        ("http://192.0.0.9/hook", "an IETF protocol assignment address"),
        ("http://168.63.129.16/machine?comp=goalstate", "168.63.129.16, a cloud platform address"),
        (f"http://{PUBLIC}:22/hook", "port 22 is not allowed for webhooks; use one of 80, 443"),
        (f"https://{PUBLIC}:8443/hook", "port 8443 is not allowed"),
    ],
)
def test_registration_refuses(api, url, reason):
    response = api.post("/v1/webhook_endpoints", {"url": url}, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["param"] == "url"
    assert reason in response.json()["error"]["message"]
    assert not WebhookEndpoint.objects.exists()


def test_ports_80_443_and_the_configured_extras_are_allowed(api, settings):
    for url in (f"http://{PUBLIC}/", f"https://{PUBLIC}:443/", f"http://{PUBLIC}:80/h"):
        assert api.post("/v1/webhook_endpoints", {"url": url}, format="json").status_code == 200, url
    settings.WEBHOOK_EXTRA_PORTS = [8443]
    assert api.post("/v1/webhook_endpoints", {"url": f"https://{PUBLIC}:8443/"}, format="json").status_code == 200
    assert api.post("/v1/webhook_endpoints", {"url": f"https://{PUBLIC}:8444/"}, format="json").status_code == 400


def test_loopback_any_port_only_with_the_loopback_setting():
    target = target_resolve("http://127.0.0.1:18080/h", policy=UrlPolicy(allow_loopback=True))
    assert target.port == 18080
    with pytest.raises(Exception, match="loopback"):
        target_resolve("http://127.0.0.1:18080/h", policy=UrlPolicy())


def test_the_extra_ports_setting_fails_loudly(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from controlplane.core.env import env_int_list

    monkeypatch.setenv("WEBHOOK_EXTRA_PORTS", "8443, 9443")
    assert env_int_list("WEBHOOK_EXTRA_PORTS", [], minimum=1, maximum=65535, help="Extra ports.") == [8443, 9443]
    for bad in ("https", "70000", "0"):
        monkeypatch.setenv("WEBHOOK_EXTRA_PORTS", bad)
        with pytest.raises(ImproperlyConfigured, match="WEBHOOK_EXTRA_PORTS"):
            env_int_list("WEBHOOK_EXTRA_PORTS", [], minimum=1, maximum=65535, help="Extra ports.")


@pytest.fixture
def dns(monkeypatch) -> dict[str, str]:
    """Names this test resolves itself (host -> address); every other name goes to the real resolver."""
    answers: dict[str, str] = {}
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in answers:
            address = answers[host]
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            return [(family, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return answers


@pytest.mark.parametrize("rebound", ["2002:a00:1::1", "64:ff9b::a00:1", "192.0.0.9", "168.63.129.16"])
def test_a_host_rebound_to_a_refused_range_is_refused_at_the_attempt(tenant, dns, messages, monkeypatch, rebound):
    dns["hooks.example.com"] = PUBLIC
    services.webhook_endpoint_create(tenant=tenant, url="https://hooks.example.com/hook")
    [delivery_id] = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_1", event_type="batch.completed")
    dns["hooks.example.com"] = rebound
    connected: list[object] = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **kw: connected.append(a))
    outcome = attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    assert outcome is not None and outcome.status_code is None
    assert f"resolves to {rebound}" in outcome.error
    assert connected == []
    assert WebhookDelivery.objects.get(id=delivery_id).status == DeliveryStatus.FAILED


def test_a_port_no_longer_allowed_is_refused_at_the_attempt(tenant, dns, messages, settings, monkeypatch):
    dns["hooks.example.com"] = PUBLIC
    settings.WEBHOOK_EXTRA_PORTS = [8443]
    services.webhook_endpoint_create(tenant=tenant, url="https://hooks.example.com:8443/hook")
    [delivery_id] = services.batch_event_emit(tenant_id=tenant.id, batch_id="batch_1", event_type="batch.completed")
    settings.WEBHOOK_EXTRA_PORTS = []
    connected: list[object] = []
    monkeypatch.setattr(socket, "create_connection", lambda *a, **kw: connected.append(a))
    outcome = attempts.delivery_attempt(delivery_id=delivery_id, now=timezone.now())
    assert outcome is not None and "port 8443 is not allowed" in outcome.error
    assert connected == []
