"""Throttling of the admin's login form: at most ADMIN_LOGIN_MAX_FAILURES_PER_USER failed POSTs per username
and ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS per client address in each fixed window (settings/console.py); past
either, the POST is answered 429 with Retry-After, without checking the password.

Each POST takes one from both budgets *before* the password is checked (one atomic upsert per budget), and a
login that succeeds gives them back. Counting first bounds the guesses exactly: counting failures afterwards
would let every POST that arrives while others are being checked (a password hash takes ~0.3 s) through
the limit. A successful login is therefore never throttled by its own earlier attempts beyond the limit, and
never counts. The price of a per-username limit is that someone can keep one account's login closed by
failing on purpose: for one window at a time, while an operator with another account, or the shell, can still
get in; that is preferred to unlimited guessing."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import F
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.urls import reverse
from django.utils import timezone

from controlplane.console.models import AdminLoginWindow
from controlplane.core.windows import window_increment


def _window_start(now: datetime) -> datetime:
    """Fixed windows aligned to the epoch, so every process agrees on them."""
    seconds = settings.ADMIN_LOGIN_WINDOW_SECONDS
    return datetime.fromtimestamp(int(now.timestamp()) // seconds * seconds, tz=UTC)


def _key(scope: str, value: str) -> str:
    return hashlib.sha256(f"{scope}\0{value}".encode()).hexdigest()


def _increment(*, key: str, window_start: datetime) -> int:
    """Add one to the key's count for the window and return the new count (core/windows.py). Autocommit: a count is
    never taken back by a rollback."""
    count = window_increment(AdminLoginWindow, key_field="key", key=key, window_start=window_start)
    if count == 1:
        # The first attempt of a new window: every earlier window, of any key, is done with. One indexed DELETE
        # per key and window keeps the table small even when many usernames are tried.
        AdminLoginWindow.objects.filter(window_start__lt=window_start).delete()
    return count


def _refund(*, keys: list[str], window_start: datetime) -> None:
    AdminLoginWindow.objects.filter(key__in=keys, window_start=window_start, count__gt=0).update(count=F("count") - 1)


def client_address(request: HttpRequest) -> str:
    header = settings.ADMIN_LOGIN_CLIENT_ADDRESS_HEADER
    forwarded = request.META.get(header, "") if header else ""
    # A proxy's X-Real-IP is one address; a list (X-Forwarded-For) counts by its last entry, the one the proxy
    # in front of us appended.
    return str(forwarded).split(",")[-1].strip() or str(request.META.get("REMOTE_ADDR", ""))


class AdminLoginThrottleMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response
        self._login_path: str | None = None

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.method != "POST":
            return self.get_response(request)
        if self._login_path is None:
            self._login_path = reverse("admin:login")
        if request.path_info != self._login_path:
            return self.get_response(request)
        now = timezone.now()
        window_start = _window_start(now)
        username = str(request.POST.get("username", "")).strip().casefold()[:150]
        budgets = (
            (_key("user", username), settings.ADMIN_LOGIN_MAX_FAILURES_PER_USER),
            (_key("address", client_address(request)), settings.ADMIN_LOGIN_MAX_FAILURES_PER_ADDRESS),
        )
        counts = [(key, _increment(key=key, window_start=window_start), limit) for key, limit in budgets]
        if any(count > limit for _, count, limit in counts):
            retry_after = (window_start + timedelta(seconds=settings.ADMIN_LOGIN_WINDOW_SECONDS) - now).seconds
            refused = HttpResponse(
                "Too many failed logins for this username or from this address; try again in "
                f"{retry_after + 1} seconds.",
                status=429,
                content_type="text/plain; charset=utf-8",
            )
            refused["Retry-After"] = str(retry_after + 1)
            return refused
        response = self.get_response(request)
        # The admin's login view redirects only after django.contrib.auth.login(), which sets request.user.
        user = getattr(request, "user", None)
        if response.status_code == 302 and user is not None and user.is_authenticated:
            _refund(keys=[key for key, _, _ in counts], window_start=window_start)
        return response
