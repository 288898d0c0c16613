"""Idempotency-Key on POST /v1/files and POST /v1/batches (controlplane/core/http/idempotency.py)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from controlplane.batches import services as batch_services
from controlplane.batches.models import Batch
from controlplane.core.http.idempotency import idempotency_records_prune
from controlplane.core.messaging import dispatch
from controlplane.core.models import IdempotencyRecord
from controlplane.files.models import File
from tests.support.batches import embedding_line, jsonl
from tests.support.row_locks import GIVE_UP_SECONDS, connect

CONTENT = jsonl([embedding_line("a", "x")])


@pytest.fixture
def quiet(monkeypatch):
    # Nothing reaches a broker: the on_commit sends of batch create go nowhere.
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)


def _client(tenant) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")
    return client


def _upload(api, key: str | None = None, content: bytes = CONTENT, name: str = "in.jsonl"):
    headers = {"Idempotency-Key": key} if key else {}
    return api.post(
        "/v1/files",
        {"file": SimpleUploadedFile(name, content), "purpose": "batch"},
        format="multipart",
        headers=headers,
    )


def _create_batch(api, file_id: str, key: str | None = None, **extra):
    headers = {"Idempotency-Key": key} if key else {}
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h", **extra}
    return api.post("/v1/batches", body, format="json", headers=headers)


@pytest.mark.django_db
class TestReplay:
    def test_a_replayed_batch_create_returns_the_same_batch(self, api, quiet):
        file_id = _upload(api).json()["id"]
        first = _create_batch(api, file_id, key="k-1", metadata={"a": "1"})
        again = _create_batch(api, file_id, key="k-1", metadata={"a": "1"})
        assert first.status_code == again.status_code == 200
        assert again.json() == first.json()
        assert again["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
        assert Batch.objects.count() == 1

    def test_a_replayed_upload_returns_the_same_file(self, api):
        first = _upload(api, key="f-1")
        again = _upload(api, key="f-1")
        assert first.status_code == again.status_code == 200
        assert again.json() == first.json()
        assert File.objects.count() == 1

    def test_without_a_key_every_request_creates(self, api, quiet):
        file_id = _upload(api).json()["id"]
        assert _create_batch(api, file_id).json()["id"] != _create_batch(api, file_id).json()["id"]
        assert not IdempotencyRecord.objects.exists()

    def test_json_key_order_does_not_matter(self, api, quiet):
        file_id = _upload(api).json()["id"]
        body = {"input_file_id": file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        first = api.post("/v1/batches", body, format="json", headers={"Idempotency-Key": "k"})
        reordered = dict(reversed(list(body.items())))
        again = api.post("/v1/batches", reordered, format="json", headers={"Idempotency-Key": "k"})
        assert again.status_code == 200 and again.json()["id"] == first.json()["id"]


@pytest.mark.django_db
class TestConflicts:
    def test_another_batch_body_with_the_same_key_is_409_naming_the_key(self, api, quiet):
        file_id = _upload(api).json()["id"]
        assert _create_batch(api, file_id, key="k-2").status_code == 200
        response = _create_batch(api, file_id, key="k-2", metadata={"a": "other"})
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "idempotency_key_reused" and "'k-2'" in error["message"]
        assert response["x-should-retry"] == "false"  # the SDK must not retry a misuse
        assert Batch.objects.count() == 1

    @pytest.mark.parametrize(
        "change", [{"content": CONTENT + CONTENT}, {"name": "other.jsonl"}], ids=["content", "filename"]
    )
    def test_another_upload_with_the_same_key_is_409(self, api, change):
        assert _upload(api, key="f-2").status_code == 200
        response = _upload(api, key="f-2", **change)
        assert response.status_code == 409 and "'f-2'" in response.json()["error"]["message"]
        assert File.objects.count() == 1

    def test_a_key_used_on_another_endpoint_is_409(self, api, quiet):
        file_id = _upload(api, key="shared").json()["id"]
        assert _create_batch(api, file_id, key="shared").status_code == 409

    def test_different_tenants_may_use_the_same_key(self, api, other_tenant, quiet):
        other = _client(other_tenant)
        mine, theirs = _upload(api, key="same"), _upload(other, key="same")
        assert mine.status_code == theirs.status_code == 200
        assert mine.json()["id"] != theirs.json()["id"]
        assert _create_batch(other, theirs.json()["id"], key="b").status_code == 200
        assert _create_batch(api, mine.json()["id"], key="b").status_code == 200
        assert Batch.objects.count() == 2

    @pytest.mark.parametrize("key", ["x" * 256, "bad\tkey"])
    def test_a_malformed_key_is_400(self, api, key):
        response = _upload(api, key=key)
        assert response.status_code == 400 and "Idempotency-Key" in response.json()["error"]["message"]


@pytest.mark.django_db
class TestLifecycle:
    def test_errors_are_not_stored_so_a_fixed_retry_with_the_key_works(self, api, quiet):
        file_id = _upload(api).json()["id"]
        refused = _create_batch(api, file_id, key="k-3", completion_window="1y")
        assert refused.status_code == 400
        assert not IdempotencyRecord.objects.exists()
        assert _create_batch(api, file_id, key="k-3").status_code == 200

    def test_after_the_ttl_the_key_is_free_again_and_pruned(self, api, quiet, settings):
        file_id = _upload(api).json()["id"]
        first = _create_batch(api, file_id, key="k-4").json()["id"]
        past = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_KEY_TTL_SECONDS + 1)
        IdempotencyRecord.objects.update(created_at=past)
        # Expired: the same key may now name a new request (here: a different body).
        second = _create_batch(api, file_id, key="k-4", metadata={"n": "2"})
        assert second.status_code == 200 and second.json()["id"] != first
        assert IdempotencyRecord.objects.get().created_at > past
        IdempotencyRecord.objects.update(created_at=past)
        assert idempotency_records_prune(now=timezone.now()) == 1
        assert not IdempotencyRecord.objects.exists()

    def test_the_prune_task_is_scheduled(self, settings):
        tasks = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
        assert "core.idempotency_records_prune" in tasks


@pytest.mark.django_db(transaction=True)
class TestConcurrency:
    # The racers' answers as they arrive: the winner's slow create waits on them (see slow_create).
    answered: list
    hold_until_answered: bool

    def _race(self, tenant, file_id: str, key: str, count: int = 2) -> list:
        """``count`` same-key creates at once, each from its own thread and database connection."""
        start = threading.Barrier(count)
        responses: list = self.answered
        errors: list[BaseException] = []

        def create() -> None:
            try:
                client = _client(tenant)
                start.wait()
                responses.append(_create_batch(client, file_id, key=key))
            except BaseException as exc:  # noqa: BLE001 - surfaced below; a thread's exception is otherwise lost
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=create) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        return responses

    @pytest.fixture
    def slow_create(self, monkeypatch):
        """batch_create that holds the key until the other racer has surely arrived: it waits for it on the
        key's row lock (Postgres), or for its answer (a 409 after a bounded wait, or at once on SQLite). An
        event, not a sleep: on a loaded machine a fixed pause let the second request come after the first
        had committed, and the race was not run at all."""
        real = batch_services.batch_create
        self.answered = []
        self.hold_until_answered = False  # a test whose loser must give up first sets it
        overlapped: list[str] = []

        def lock_waiters() -> int:
            if connection.vendor != "postgresql":
                return 0
            with connect(autocommit=True) as observer:
                return observer.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                ).fetchone()[0]

        def slow(**kwargs):
            started = time.monotonic()
            while time.monotonic() - started < GIVE_UP_SECONDS:
                if self.answered:
                    overlapped.append("the other racer answered while this one held the key")
                    break
                if not self.hold_until_answered and lock_waiters():
                    overlapped.append("the other racer waits on the key's lock")
                    break
                time.sleep(0.01)
            print(f"winner held the key {time.monotonic() - started:.2f} s until: {overlapped}")
            return real(**kwargs)

        monkeypatch.setattr(batch_services, "batch_create", slow)
        yield
        assert overlapped, f"the racers never overlapped within {GIVE_UP_SECONDS} s"

    def test_concurrent_same_key_creates_make_one_batch(self, api, tenant, quiet, slow_create):
        file_id = _upload(api).json()["id"]
        responses = self._race(tenant, file_id, "race")
        if connection.vendor == "sqlite":
            # Claims commit apart from the work there: the loser is told to retry (tests/core/test_idempotency_sqlite.py).
            codes = sorted(r.status_code for r in responses)
            assert codes == [200, 409] and Batch.objects.count() == 1
            return
        # The loser waited for the winner's commit and replays its answer.
        assert [r.status_code for r in responses] == [200, 200]
        assert len({r.json()["id"] for r in responses}) == 1
        assert Batch.objects.count() == 1
        assert sorted(r.has_header("Idempotent-Replayed") for r in responses) == [False, True]

    def test_an_upload_with_a_key_copies_outside_any_transaction(self, api, tenant, monkeypatch):
        """A 1 GiB copy would hold a transaction (a connection, the key's lock) for minutes: the claim commits
        first, the copy runs outside, and a same-key upload meanwhile is told to retry at once."""
        from controlplane.files import services as file_services

        real, during = file_services.blob_save, []

        def save(*args, **kwargs):
            during.append(connection.in_atomic_block)
            if len(during) == 1:  # the first upload's copy: a same-key upload arrives meanwhile
                during.append(_upload(_client(tenant), key="big"))
            return real(*args, **kwargs)

        monkeypatch.setattr(file_services, "blob_save", save)
        first = _upload(api, key="big")
        assert first.status_code == 200 and during[0] is False
        assert during[1].status_code == 409 and during[1].json()["error"]["code"] == "idempotency_key_in_progress"
        replay = _upload(api, key="big")
        assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
        assert File.objects.count() == 1

    def test_a_loser_that_waits_too_long_gets_a_retryable_409(self, api, tenant, quiet, slow_create, settings):
        if connection.vendor != "postgresql":
            pytest.skip("the bounded wait is Postgres' lock_timeout")
        settings.IDEMPOTENCY_WAIT_SECONDS = 0.1
        self.hold_until_answered = True  # the winner holds the key until the loser's bounded wait has ended
        file_id = _upload(api).json()["id"]
        responses = sorted(self._race(tenant, file_id, "slow"), key=lambda r: r.status_code)
        assert [r.status_code for r in responses] == [200, 409]
        assert responses[1].json()["error"]["code"] == "idempotency_key_in_progress"
        assert responses[1]["x-should-retry"] == "true"
        assert Batch.objects.count() == 1
        # Once the winner is done, the retry replays it.
        again = _create_batch(api, file_id, key="slow")
        assert again.status_code == 200 and again.json()["id"] == responses[0].json()["id"]


@pytest.fixture
def keep_test_connection():
    """A WSGI request closes the database connection when it finishes; the test's transaction lives on it
    (Django's test Client disconnects the same handler)."""
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.mark.django_db
def test_the_openai_sdk_replays_with_extra_headers(tenant, quiet, keep_test_connection):
    """The official client, in process (WSGI transport). It sets no Idempotency-Key of its own (its
    ``idempotency_key=`` option needs a header name the OpenAI client does not configure), so callers pass
    ``extra_headers``; a reused key is a ConflictError that the client does not retry."""
    import httpx2
    import openai
    from django.core.wsgi import get_wsgi_application

    seen: list[str] = []

    def count(request: httpx2.Request) -> None:
        seen.append(request.url.path)

    client = openai.OpenAI(
        api_key=tenant.raw_key,
        base_url="http://testserver/v1",
        http_client=httpx2.Client(
            transport=httpx2.WSGITransport(app=get_wsgi_application()), event_hooks={"request": [count]}
        ),
    )
    upload = {"file": ("in.jsonl", CONTENT), "purpose": "batch"}
    first = client.files.create(**upload, extra_headers={"Idempotency-Key": "sdk-f"})
    assert client.files.create(**upload, extra_headers={"Idempotency-Key": "sdk-f"}).id == first.id
    create = {"input_file_id": first.id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
    batch = client.batches.create(**create, extra_headers={"Idempotency-Key": "sdk-b"})
    assert client.batches.create(**create, extra_headers={"Idempotency-Key": "sdk-b"}).id == batch.id
    seen.clear()
    with pytest.raises(openai.ConflictError, match="sdk-b"):
        client.batches.create(**create, metadata={"x": "y"}, extra_headers={"Idempotency-Key": "sdk-b"})
    assert seen == ["/v1/batches"]  # x-should-retry: false, so no retries
    assert Batch.objects.count() == 1 and File.objects.count() == 1
