"""Error shapes: the 429 (Retry-After, OpenAI's x-ratelimit-* headers, the limit named in the body) and the
503 of a database that refuses."""

from __future__ import annotations

from controlplane.core.http.errors import QuotaExceeded, api_exception_handler


def test_quota_error_names_the_limit_in_body_and_headers():
    exc = QuotaExceeded(
        "Over the enqueued-lines quota.",
        code="enqueued_lines_limit_exceeded",
        limit="max_enqueued_lines",
        value=1000,
        current=900,
        requested=200,
        retry_after=11.2,
        headers={"x-should-retry": "false"},
    )
    response = api_exception_handler(exc, {})
    assert response.status_code == 429
    assert response.data == {
        "error": {
            "message": "Over the enqueued-lines quota.",
            "type": "rate_limit_error",
            "param": None,
            "code": "enqueued_lines_limit_exceeded",
            "limit": {"name": "max_enqueued_lines", "value": 1000, "current": 900, "requested": 200},
        }
    }
    assert response["Retry-After"] == "12"  # whole seconds, rounded up
    assert response["x-ratelimit-limit-enqueued-lines"] == "1000"
    assert response["x-ratelimit-remaining-enqueued-lines"] == "100"
    assert response["x-ratelimit-reset-enqueued-lines"] == "12s"
    assert response["x-should-retry"] == "false"


def test_request_rate_uses_openais_header_names_and_never_says_retry_in_0():
    exc = QuotaExceeded(
        "Too many requests.",
        limit="max_requests_per_minute",
        value=3,
        current=5,
        requested=1,
        retry_after=0.2,
        header_name="requests",
    )
    response = api_exception_handler(exc, {})
    assert response["Retry-After"] == "1"
    assert (
        response["x-ratelimit-limit-requests"],
        response["x-ratelimit-remaining-requests"],
        response["x-ratelimit-reset-requests"],
    ) == ("3", "0", "1s")


def test_a_message_alone_still_works():
    response = api_exception_handler(QuotaExceeded("Slow down."), {})
    assert response.status_code == 429
    assert response.data == {
        "error": {"message": "Slow down.", "type": "rate_limit_error", "param": None, "code": "quota_exceeded"}
    }
    assert response["Retry-After"] == "60"
    assert not [name for name in response.headers if name.lower().startswith("x-ratelimit")]


def test_a_database_that_refuses_is_a_503_with_retry_after_not_a_500(api, monkeypatch):
    # What psycopg raises, through Django's wrapper, when Postgres is restarting or out of connections.
    from django.db import OperationalError

    from controlplane.batches import selectors

    def refused(**_kwargs):
        raise OperationalError('connection to server at "127.0.0.1", port 5432 failed: sorry, too many clients already')

    monkeypatch.setattr(selectors, "batch_list", refused)
    response = api.get("/v1/batches")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "too many clients" not in response.json()["error"]["message"]  # no internals to the client
    assert response["Retry-After"] == "2"
