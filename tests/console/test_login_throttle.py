"""Failed admin logins are throttled per username and per client address (console/login_throttle.py);
successful ones are not, and do not count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from controlplane.console import login_throttle
from controlplane.console.models import AdminLoginWindow

pytestmark = pytest.mark.django_db
LOGIN = "/admin/login/"


@pytest.fixture(autouse=True)
def small_limits(settings, monkeypatch):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins
    settings.ADMIN_LOGIN_MAX_FAILURES_PER_USER = 3
    settings.ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS = 5
    settings.ADMIN_LOGIN_WINDOW_SECONDS = 300
    User.objects.create_superuser("ops", "ops@example.com", "right-password")


def _post(username: str, password: str, address: str = "10.1.1.1") -> int:
    return Client(REMOTE_ADDR=address).post(LOGIN, {"username": username, "password": password}).status_code


def test_failures_past_the_per_username_limit_get_429_even_with_the_right_password():
    assert [_post("ops", "wrong", address=f"10.0.0.{i}") for i in range(3)] == [200, 200, 200]  # the form's error
    response = Client(REMOTE_ADDR="10.0.0.9").post(LOGIN, {"username": "OPS ", "password": "right-password"})
    assert response.status_code == 429 and int(response["Retry-After"]) <= 300
    assert "Too many failed logins" in response.content.decode()
    assert _post("someone-else", "wrong", address="10.0.0.9") == 200  # another username is not held back


def test_failures_past_the_per_address_limit_get_429_for_any_username():
    assert [_post(f"user{i}", "wrong") for i in range(5)] == [200] * 5
    assert _post("ops", "right-password") == 429
    assert _post("ops", "right-password", address="10.9.9.9") == 302  # from elsewhere it works


def test_successful_logins_are_not_counted():
    for _ in range(10):
        assert _post("ops", "right-password") == 302
    assert _post("ops", "wrong") == 200
    assert set(AdminLoginWindow.objects.values_list("count", flat=True)) == {1}


def test_a_new_window_opens_the_door_again_and_prunes_the_old(monkeypatch):
    for _ in range(4):
        _post("ops", "wrong")
    assert _post("ops", "right-password") == 429
    later = timezone.now() + timedelta(seconds=301)
    monkeypatch.setattr(login_throttle.timezone, "now", lambda: later)
    assert _post("ops", "right-password") == 302
    assert all(row.window_start > later - timedelta(seconds=300) for row in AdminLoginWindow.objects.all())


def test_the_address_comes_from_the_configured_proxy_header(settings):
    proxy = "172.18.0.5"  # every request reaches gunicorn from the proxy
    for i in range(5):
        assert _post(f"user{i}", "wrong", address=proxy) == 200
    assert _post("ops", "right-password", address=proxy) == 429  # without the header: all clients are one
    AdminLoginWindow.objects.all().delete()

    settings.ADMIN_LOGIN_CLIENT_ADDRESS_HEADER = "HTTP_X_REAL_IP"
    for i in range(5):
        response = Client(REMOTE_ADDR=proxy, HTTP_X_REAL_IP=f"192.0.2.{i}").post(
            LOGIN, {"username": f"user{i}", "password": "wrong"}
        )
        assert response.status_code == 200
    # Five clients behind one proxy: none of them is at its limit.
    assert (
        Client(REMOTE_ADDR=proxy, HTTP_X_REAL_IP="192.0.2.77")
        .post(LOGIN, {"username": "ops", "password": "right-password"})
        .status_code
        == 302
    )


def test_no_username_or_address_is_stored():
    _post("ops", "wrong")
    keys = list(AdminLoginWindow.objects.values_list("key", flat=True))
    assert len(keys) == 2 and not {"ops", "10.1.1.1"} & set(keys)
    assert all(len(key) == 64 for key in keys)
