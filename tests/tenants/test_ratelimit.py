"""Per-API-key request rate over fixed one-minute windows, counted in the database."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.core.http.errors import QuotaExceeded
from controlplane.tenants.models import ApiKey, ApiKeyRequestWindow
from controlplane.tenants.services import api_key_create, api_request_record

pytestmark = pytest.mark.django_db

MIDDLEWARE = "controlplane.tenants.middleware.RateLimitHeadersMiddleware"
NOON = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def rate_headers_middleware(settings):
    # Until settings.MIDDLEWARE lists it; a no-op afterwards.
    if MIDDLEWARE not in settings.MIDDLEWARE:
        settings.MIDDLEWARE = [*settings.MIDDLEWARE, MIDDLEWARE]


def _at(moment: datetime):
    return mock.patch("django.utils.timezone.now", return_value=moment)


def _client(raw_key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client


def _rate_headers(response) -> tuple[str, str, str]:
    return (
        response["x-ratelimit-limit-requests"],
        response["x-ratelimit-remaining-requests"],
        response["x-ratelimit-reset-requests"],
    )


def test_fourth_request_in_a_minute_is_429_with_headers_and_body(api, tenant):
    tenant.max_requests_per_minute = 3
    tenant.save()
    with _at(NOON + timedelta(seconds=48)):
        remaining = []
        for _ in range(3):
            response = api.get("/v1/batches")
            assert response.status_code == 200
            remaining.append(response["x-ratelimit-remaining-requests"])
            assert response["x-ratelimit-limit-requests"] == "3"
            assert response["x-ratelimit-reset-requests"] == "12s"
        assert remaining == ["2", "1", "0"]
        response = api.get("/v1/files")
    assert response.status_code == 429
    assert response["Retry-After"] == "12"  # seconds to the next window
    assert _rate_headers(response) == ("3", "0", "12s")
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    assert error["param"] is None and "limit 3" in error["message"]
    assert error["limit"] == {"name": "max_requests_per_minute", "value": 3, "current": 3, "requested": 1}


def test_the_next_window_starts_from_zero_and_prunes_the_old_one(api, tenant):
    tenant.max_requests_per_minute = 1
    tenant.save()
    with _at(NOON + timedelta(seconds=59, microseconds=999_000)):
        assert api.get("/v1/batches").status_code == 200
        response = api.get("/v1/batches")
        assert response.status_code == 429 and response["Retry-After"] == "1"
    with _at(NOON + timedelta(minutes=1)):
        response = api.get("/v1/batches")
        assert response.status_code == 200
        assert _rate_headers(response) == ("1", "0", "60s")
    key = ApiKey.objects.get(tenant=tenant)
    assert list(ApiKeyRequestWindow.objects.filter(api_key=key).values_list("window_start", "count")) == [
        (NOON + timedelta(minutes=1), 1)
    ]


def test_each_key_of_a_tenant_has_its_own_count(api, tenant):
    tenant.max_requests_per_minute = 2
    tenant.save()
    _, second_key = api_key_create(tenant=tenant, name="second")
    second = _client(second_key)
    with _at(NOON):
        assert [api.get("/v1/batches").status_code for _ in range(3)] == [200, 200, 429]
        assert [second.get("/v1/batches").status_code for _ in range(3)] == [200, 200, 429]


def test_rejected_and_unauthenticated_requests_get_no_rate_headers(api, admin_client):
    response = APIClient().get("/v1/batches")
    assert response.status_code == 401 and not response.has_header("x-ratelimit-limit-requests")
    assert not admin_client.get("/admin/").has_header("x-ratelimit-limit-requests")
    assert not ApiKeyRequestWindow.objects.exists()


def test_the_limit_is_the_tenants_current_setting(tenant):
    key = ApiKey.objects.select_related("tenant").get(tenant=tenant)
    key.tenant.max_requests_per_minute = 1
    assert api_request_record(api_key=key, now=NOON).count == 1
    with pytest.raises(QuotaExceeded) as raised:
        api_request_record(api_key=key, now=NOON + timedelta(seconds=30))
    assert raised.value.retry_after == 30
    key.tenant.max_requests_per_minute = 5
    assert api_request_record(api_key=key, now=NOON + timedelta(seconds=31)).count == 3


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_each_get_their_own_count(other_tenant):
    """Several processes' requests at once: the upsert hands out every count exactly once."""
    key = ApiKey.objects.select_related("tenant").get(tenant=other_tenant)
    key.tenant.max_requests_per_minute = 10_000
    counts: list[int] = []
    errors: list[BaseException] = []

    def hit() -> None:
        try:
            for _ in range(25):
                counts.append(api_request_record(api_key=key, now=NOON).count)
        except BaseException as exc:  # noqa: BLE001 - surfaced below; a thread's exception is otherwise lost
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(counts) == list(range(1, 201))
