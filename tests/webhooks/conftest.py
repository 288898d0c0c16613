from __future__ import annotations

from collections.abc import Iterator

import httpx2
import openai
import pytest
from django.core.wsgi import get_wsgi_application

from tests.support.webhook_receiver import Receiver


@pytest.fixture
def loopback(settings):
    """Endpoints on 127.0.0.1 allowed, as in the local runner (production refuses them)."""
    settings.WEBHOOK_ALLOW_LOOPBACK = True


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture
def messages(monkeypatch) -> list[tuple[str, list]]:
    """Broker messages the code sends (task name, args), instead of a broker."""
    from controlplane.core.messaging import dispatch

    sent: list[tuple[str, list]] = []
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: sent.append((task_name, args)))
    return sent


def unwrap(received, secret: str):
    """What a tenant does with a delivery: the official SDK verifies the signature and parses the event."""
    return openai.OpenAI(api_key="unused").webhooks.unwrap(received.body, received.headers, secret=secret)


@pytest.fixture
def keep_test_connection():
    """A WSGI request closes the database connection when it finishes; the test's transaction lives on it."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def sdk(tenant, keep_test_connection) -> openai.OpenAI:
    """The tenant's official client, in process over a WSGI transport."""
    return openai.OpenAI(
        api_key=tenant.raw_key,
        base_url="http://testserver/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.WSGITransport(app=get_wsgi_application())),
    )
