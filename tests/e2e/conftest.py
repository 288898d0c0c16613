"""The whole stack as users run it: gunicorn, a Celery worker and beat as real processes, real Postgres
and Redis, and a real tritonserver (shared with tests/triton through the session fixture)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from deploy.local.databases import migrated_database
from deploy.local.stack import Stack, find_free_port
from tests.support.stack_tenants import tenant_key
from tests.support.triton_fixture import pytest_runtest_makereport, triton_model_repository, triton_server

BROKER_URL = os.environ.get("E2E_BROKER_URL", "redis://127.0.0.1:6379/14")


class E2E:
    """The running stack plus what tests need to look at it from outside."""

    def __init__(self, stack: Stack, db_url: str, api_key: str):
        self.stack = stack
        self.db_url = db_url
        self.api_key = api_key
        self._conn: psycopg.Connection | None = None

    @property
    def base_url(self) -> str:
        return f"{self.stack.base_url}/v1"

    def sdk(self, api_key: str | None = None):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=api_key or self.api_key, max_retries=0, timeout=60)

    def new_tenant(self, name: str) -> str:
        return tenant_key(self.db_url, name)

    def sql(self, query: str, *params: object) -> list[tuple]:
        # One connection for the stack's life, not one per query: a new Postgres backend cost ~5 ms of the host's
        # CPU against 0.03 ms for a query on an open connection, and the scenarios poll every 0.1-0.25 s.
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.db_url, autocommit=True)
        return self._conn.execute(query, params).fetchall()

    def tenant_update(self, name: str, assignment: str, *params: object) -> None:
        """A tenant's row changed by hand (a pause, a quota); the assignment comes from the test, never from input."""
        updated = self.sql(f"UPDATE tenants_tenant SET {assignment} WHERE name=%s RETURNING id", *params, name)
        assert len(updated) == 1, f"tenant {name} not found"

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def wait_status(self, client, batch_id: str, statuses: set[str], timeout_s: float = 180):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = client.batches.retrieve(batch_id)
            if batch.status in statuses:
                return batch
            time.sleep(0.2)
        raise AssertionError(
            f"batch {batch_id} still {batch.status} after {timeout_s}s\n{self.stack.log_dir}/worker.log"
        )


def broker_env(url: str) -> dict[str, str]:
    """A stack's broker settings: a shared Redis database, with a key prefix of the stack's own, so stacks of
    test runs side by side (xdist workers, checkouts) never take each other's messages and need no flush."""
    return {"CELERY_BROKER_URL": url, "CELERY_BROKER_KEY_PREFIX": f"stack-{uuid.uuid4().hex[:8]}:"}


@pytest.fixture(scope="session")
def e2e(triton_server, tmp_path_factory) -> Iterator[E2E]:
    with migrated_database("cp_e2e") as db_url:
        yield from _e2e_stack(triton_server, tmp_path_factory, db_url)


def _e2e_stack(triton_server, tmp_path_factory, db_url: str) -> Iterator[E2E]:
    var_dir = Path(tmp_path_factory.mktemp("stack"))
    env = {
        "DATABASE_URL": db_url,
        **broker_env(BROKER_URL),
        # Small shards and short leases make several shards per batch and a quick rescue.
        "SHARD_MAX_LINES": "16",
        "SHARD_LEASE_SECONDS": "3",
        "RESCUE_INTERVAL_SECONDS": "1",
        "EXPIRY_INTERVAL_SECONDS": "1",
        "SPEND_CAP_INTERVAL_SECONDS": "1",
        "BATCH_COMPLETION_WINDOWS": "24h,8s,20s",  # 20s: deadline promotion (test_scheduling.py)
        "FILE_MAX_BYTES": str(2 * 1024 * 1024),
    }
    stack = Stack(
        var_dir=var_dir, web_port=find_free_port(), env=env, with_triton=False, triton_grpc_url=triton_server.grpc_url
    )
    stack.start()
    try:
        key = tenant_key(db_url, "e2e-tenant")
        e2e = E2E(stack, db_url, key)
        yield e2e
        e2e.close()
    finally:
        stack.stop()
