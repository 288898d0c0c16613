"""``Idempotency-Key`` on the create endpoints (``POST /v1/files``, ``POST /v1/batches``).

The openai SDK sends the header with ``idempotency_key=`` (or ``extra_headers``) and retries 409s and 5xx
with the same key, so:

- same key + same request from the same tenant → the stored answer of the first (same object, status and
  body, plus ``Idempotent-Replayed: true``); no second object is created;
- same key + a different request (method, path or body) → 409 naming the key, ``x-should-retry: false``;
- a key is kept ``IDEMPOTENCY_KEY_TTL_SECONDS`` (24 h); after that it is free again and the beat task
  ``core.idempotency_records_prune`` deletes the row.

Protocol: one transaction holds the claim and the create. The key row is inserted first (in a savepoint),
then the create runs, then the row gets the response, and all of it commits together. A concurrent request
with the same key blocks on the unique index until the first commits (then it replays the answer) or rolls
back (then it creates). So a visible row always has its answer, and a crash between claim and create
leaves nothing behind. On Postgres the wait is bounded (``IDEMPOTENCY_WAIT_SECONDS``); past it the loser
gets a retryable 409 ``idempotency_key_in_progress``.

SQLite has one write lock for the whole database, and the settings' IMMEDIATE transactions take it at BEGIN:
the protocol above held it for the whole create, so a 1 GiB upload with a key stopped every other writer
(another tenant's batch create, the workers' commits) for the length of its blob copy. On Postgres the same
upload held a transaction open for minutes (a pooled connection, the key's lock, and vacuum's horizon). So on
SQLite, and for uploads (``claim_apart``) everywhere, the claim is committed alone in a short transaction, the
create runs outside it, and the answer is recorded in another short one (an error deletes the claim instead). A same-key request meanwhile gets the retryable 409
``idempotency_key_in_progress`` at once rather than waiting: a wait would hold a web thread for as long as the
first request's copy, which is what this avoids, and the openai SDK retries that 409 by itself (Retry-After,
``x-should-retry: true``). A claim left unanswered by a crash is taken over once it is older than
``IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS``. The price: a crash after the create and before its answer is recorded
lets a retry after that timeout create a second object, which the one-transaction protocol rules out.

Only 2xx answers are stored. An error (4xx validation, quota 429, 5xx) rolls the claim back with the rest,
so a retry with the same key after fixing the request works. (Stripe also stores 4xx; ours are validation
and quota errors that a client fixes and retries, and replaying them would only get in the way.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.core.http.errors import ValidationFailed, error_body
from controlplane.core.models import IdempotencyRecord

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
_MAX_KEY_LENGTH = 255
# Postgres' "lock_not_available": the claim waited longer than IDEMPOTENCY_WAIT_SECONDS.
_LOCK_NOT_AVAILABLE = "55P03"


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key``, or None when it sends none."""
    raw = request.META.get("HTTP_IDEMPOTENCY_KEY")
    if raw is None:
        return None
    key = str(raw).strip()
    if not key or len(key) > _MAX_KEY_LENGTH or not key.isprintable():
        raise ValidationFailed(f"The {HEADER} header must be 1 to {_MAX_KEY_LENGTH} printable characters.")
    return key


def request_fingerprint(*parts: str | bytes) -> str:
    """sha256 over the parts, each length-prefixed so that ("ab", "c") and ("a", "bc") differ."""
    digest = hashlib.sha256()
    for part in parts:
        # surrogatepass: a lone surrogate in a filename or JSON string still hashes, and stays distinct.
        data = part.encode("utf-8", "surrogatepass") if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def json_fingerprint(request: Request, data: Any) -> str:
    """Fingerprint of a JSON request: the parsed body in canonical form, so key order and spacing of a
    retry do not matter (the SDK re-sends the same bytes anyway)."""
    try:
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except RecursionError as exc:
        raise ValidationFailed("The request body is nested too deeply.") from exc
    return request_fingerprint(request.method or "", request.path, canonical)


def idempotent(
    *,
    tenant_id: int,
    key: str | None,
    fingerprint: str,
    respond: Callable[[], Response],
    claim_apart: bool = False,
) -> Response:
    """Run ``respond`` (which creates the object and renders it) at most once per (tenant, key).

    Without a key this is just ``respond()``. ``respond`` must render JSON-native data: the body is stored
    as it is and returned as it is on replay. ``claim_apart``: ``respond`` is long (an upload's copy), so it
    runs outside any transaction (the module's second protocol) whatever the database."""
    if key is None:
        return respond()
    now = timezone.now()
    if claim_apart or connection.vendor == "sqlite":
        return _idempotent_claim_apart(tenant_id=tenant_id, key=key, fingerprint=fingerprint, respond=respond, now=now)
    with transaction.atomic():
        claimed = _claim(tenant_id=tenant_id, key=key, fingerprint=fingerprint, now=now)
        if claimed is not None:
            response = respond()
            if 200 <= response.status_code < 300:
                IdempotencyRecord.objects.filter(id=claimed.id).update(
                    response_status=response.status_code, response_body=response.data
                )
            else:
                # Not stored: the claim goes with everything else, and the key stays free.
                transaction.set_rollback(True)
            return response
    # Someone else's claim was committed first (or is still running, past our wait).
    return _replay(tenant_id=tenant_id, key=key, fingerprint=fingerprint, now=now)


def _idempotent_claim_apart(
    *, tenant_id: int, key: str, fingerprint: str, respond: Callable[[], Response], now: datetime
) -> Response:
    """The SQLite protocol (module docstring): claim committed, work outside any transaction, answer recorded."""
    with transaction.atomic():
        # A claim older than the timeout with no answer is a crashed request's: the key is free again.
        stale = now - timedelta(seconds=settings.IDEMPOTENCY_CLAIM_TIMEOUT_SECONDS)
        IdempotencyRecord.objects.filter(
            tenant_id=tenant_id, key=key, response_status__isnull=True, created_at__lt=stale
        ).delete()
        claimed = _claim(tenant_id=tenant_id, key=key, fingerprint=fingerprint, now=now)
    if claimed is None:
        return _replay(tenant_id=tenant_id, key=key, fingerprint=fingerprint, now=now)
    try:
        response = respond()
    except BaseException:
        IdempotencyRecord.objects.filter(id=claimed.id).delete()  # nothing was answered: the key is free again
        raise
    if 200 <= response.status_code < 300:
        IdempotencyRecord.objects.filter(id=claimed.id).update(
            response_status=response.status_code, response_body=response.data
        )
    else:
        IdempotencyRecord.objects.filter(id=claimed.id).delete()
    return response


def idempotency_key_seen(*, tenant_id: int, key: str) -> bool:
    """Whether the tenant holds a live record of ``key``: the request is then a replay (or a reuse, a 409),
    whose answer must not depend on what changed since the first (an upload's storage-quota pre-check)."""
    cutoff = _cutoff(timezone.now())
    return IdempotencyRecord.objects.filter(tenant_id=tenant_id, key=key, created_at__gte=cutoff).exists()


def idempotency_records_prune(*, now: datetime) -> int:
    """Delete the keys older than the TTL; returns how many. Expired rows are already ignored by claims,
    so this only keeps the table small."""
    deleted, _ = IdempotencyRecord.objects.filter(created_at__lt=_cutoff(now)).delete()
    return deleted


def _cutoff(now: datetime) -> datetime:
    return now - timedelta(seconds=settings.IDEMPOTENCY_KEY_TTL_SECONDS)


class _KeyInProgress(Exception):
    pass


def _claim(*, tenant_id: int, key: str, fingerprint: str, now: datetime) -> IdempotencyRecord | None:
    """Insert the key row; None when another request holds the key. The savepoint keeps the outer
    transaction usable after a lost race."""
    try:
        with transaction.atomic(), _bounded_lock_wait():
            # An expired key is free again: drop its old row before claiming it anew.
            IdempotencyRecord.objects.filter(tenant_id=tenant_id, key=key, created_at__lt=_cutoff(now)).delete()
            return IdempotencyRecord.objects.create(
                tenant_id=tenant_id, key=key, request_hash=fingerprint, created_at=now
            )
    except IntegrityError:
        return None
    except OperationalError as exc:
        if _sqlstate(exc) == _LOCK_NOT_AVAILABLE:
            return None
        raise


@contextmanager
def _bounded_lock_wait() -> Iterator[None]:
    """Postgres: wait at most IDEMPOTENCY_WAIT_SECONDS for a concurrent holder of the key. Set for this
    savepoint only: a failed claim rolls the setting back with the savepoint, a won one restores it here,
    so the create that follows keeps the session's own lock_timeout. (SQLite's IMMEDIATE transactions
    already serialise writers, with the connection's own timeout.)"""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        row = cursor.fetchone()
        previous = str(row[0]) if row else "0"
        wait_ms = int(settings.IDEMPOTENCY_WAIT_SECONDS * 1000)
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [f"{wait_ms}ms"])
    yield
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def _sqlstate(exc: BaseException) -> str | None:
    cause = exc.__cause__
    return getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)


def _replay(*, tenant_id: int, key: str, fingerprint: str, now: datetime) -> Response:
    record = (
        IdempotencyRecord.objects.filter(
            tenant_id=tenant_id, key=key, created_at__gte=_cutoff(now), response_status__isnull=False
        )
        .only("request_hash", "response_status", "response_body")
        .first()
    )
    if record is None or record.response_status is None:
        return Response(
            error_body(
                f"A request with {HEADER} {key!r} is still being processed; retry in a moment.",
                error_type="invalid_request_error",
                param=None,
                code="idempotency_key_in_progress",
            ),
            status=409,
            headers={"Retry-After": "1", "x-should-retry": "true"},
        )
    if record.request_hash != fingerprint:
        return Response(
            error_body(
                f"{HEADER} {key!r} was already used with a different request; use a new key for a new "
                f"request (keys are kept {settings.IDEMPOTENCY_KEY_TTL_SECONDS / 3600:g} hours).",
                error_type="invalid_request_error",
                param=None,
                code="idempotency_key_reused",
            ),
            status=409,
            headers={"x-should-retry": "false"},
        )
    return Response(record.response_body, status=record.response_status, headers={REPLAYED_HEADER: "true"})
