"""The SQLite idempotency protocol (core/http/idempotency.py): a keyed upload's blob copy runs outside the database
write lock, so another tenant's writes go on meanwhile; a same-key request gets a retryable 409 while it runs
and the stored answer after; a crashed claim is taken over after IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS.

The suite runs on Postgres: there ``test_on_sqlite`` runs this module again in a pytest of its own against a
throwaway SQLite file, with the production SQLite settings (WAL, IMMEDIATE transactions, 30 s lock timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.core.messaging import dispatch
from controlplane.core.models import IdempotencyRecord
from controlplane.files import services as file_services
from controlplane.files.models import File
from tests.support.batches import embedding_line, jsonl

ON_SQLITE = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
CONTENT = jsonl([embedding_line("a", "x")])
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(ON_SQLITE, reason="already on SQLite: the tests below run directly")
def test_on_sqlite(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "DATABASE_TEST_NAME": str(tmp_path / "test.sqlite3"),
        "CONTROLPLANE_VAR_DIR": str(tmp_path / "var"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "4 passed" in result.stdout, result.stdout[-2000:]


sqlite_only = pytest.mark.skipif(not ON_SQLITE, reason="run against SQLite by test_on_sqlite")


def _client(tenant) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")
    return client


def _upload(client: APIClient, key: str | None = None):
    headers = {"Idempotency-Key": key} if key else {}
    body = {"file": SimpleUploadedFile("in.jsonl", CONTENT), "purpose": "batch"}
    return client.post("/v1/files", body, format="multipart", headers=headers)


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


@pytest.fixture
def held_copy(monkeypatch):
    """The keyed upload's blob copy does not finish until the test sets the event (a slow 1 GiB copy)."""
    entered, release = threading.Event(), threading.Event()
    real = file_services.blob_save

    def slow(name, content):
        if threading.current_thread() is not threading.main_thread():
            entered.set()
            release.wait(timeout=20)
        return real(name, content)

    monkeypatch.setattr(file_services, "blob_save", slow)
    return entered, release


def _in_thread(results: dict, name: str, call) -> threading.Thread:
    def run() -> None:
        try:
            results[name] = call()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            results[name] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_keyed_upload_copying_its_blob_blocks_no_other_writer(tenant, other_tenant, quiet, held_copy):
    entered, release = held_copy
    theirs = _upload(_client(other_tenant)).json()["id"]
    results: dict = {}
    uploader = _in_thread(results, "upload", lambda: _upload(_client(tenant), key="big"))
    try:
        assert entered.wait(timeout=10), "the upload never reached its blob copy"
        started = time.monotonic()
        body = {"input_file_id": theirs, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        created = _client(other_tenant).post("/v1/batches", body, format="json")
        # Another tenant's write while the copy runs: at once, not after the copy (nor after the 30 s lock timeout).
        assert created.status_code == 200, created.content
        assert time.monotonic() - started < 3.0
        replay = _upload(_client(tenant), key="big")
        assert replay.status_code == 409 and replay.json()["error"]["code"] == "idempotency_key_in_progress"
        assert replay["x-should-retry"] == "true" and replay["Retry-After"] == "1"
    finally:
        release.set()
        uploader.join(timeout=30)
    first = results["upload"]
    assert not isinstance(first, BaseException) and first.status_code == 200, first
    again = _upload(_client(tenant), key="big")
    assert again.status_code == 200 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert File.objects.filter(tenant=tenant).count() == 1


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_crashed_claim_is_taken_over_after_the_timeout(tenant, settings):
    fresh = IdempotencyRecord.objects.create(tenant=tenant, key="crashed", request_hash="x", created_at=timezone.now())
    response = _upload(_client(tenant), key="crashed")
    assert response.status_code == 409 and response.json()["error"]["code"] == "idempotency_key_in_progress"
    old = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS + 1)
    IdempotencyRecord.objects.filter(id=fresh.id).update(created_at=old)
    taken = _upload(_client(tenant), key="crashed")
    assert taken.status_code == 200, taken.content
    record = IdempotencyRecord.objects.get(key="crashed")
    assert record.response_status == 200 and record.response_body["id"] == taken.json()["id"]


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_a_failed_create_frees_its_key(tenant, monkeypatch):
    def broken(name, content):
        raise OSError("storage down")

    monkeypatch.setattr(file_services, "blob_save", broken)
    assert _upload(_client(tenant), key="k").status_code == 500  # the API's handler answers the storage error
    assert not IdempotencyRecord.objects.exists()
    monkeypatch.undo()
    assert _upload(_client(tenant), key="k").status_code == 200


@sqlite_only
@pytest.mark.django_db(transaction=True)
def test_the_answer_is_recorded_committed_apart_from_the_create(tenant):
    first = _upload(_client(tenant), key="k2")
    again = _upload(_client(tenant), key="k2")
    assert first.status_code == again.status_code == 200 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"
    assert IdempotencyRecord.objects.get(key="k2").response_status == 200
