"""A local multi-server fleet: N tritonserver processes with declared GPUs plus the control-plane stack,
on a throwaway Postgres database (a copy of the migrated template, deploy/local/databases.py). Used by the placement scenario test and the placement benchmark."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from deploy.local.databases import migrated_database
from deploy.local.stack import Stack, find_free_port
from deploy.local.triton_server import LocalTriton, running_local_server


@dataclass
class LocalFleet:
    stack: Stack
    servers: list[LocalTriton]
    db_url: str
    api_key: str


@contextlib.contextmanager
def local_fleet(
    work_dir: Path,
    *,
    servers: int,
    gpu_bytes: int,
    env: dict[str, str],
    broker_url: str,
    gpus_per_server: int = 1,
) -> Iterator[LocalFleet]:
    with contextlib.ExitStack() as stack_of_servers:
        db_url = stack_of_servers.enter_context(migrated_database("cp_fleet"))
        # Its own key prefix on the shared Redis database: nothing to flush, and no other stack's messages.
        broker_prefix = f"{db_url.rsplit('/', 1)[1]}:"
        handles = [
            stack_of_servers.enter_context(_tolerant(running_local_server(log_path=work_dir / f"triton{i}.log")))
            for i in range(servers)
        ]
        stack = Stack(
            var_dir=work_dir / "stack",
            web_port=find_free_port(),
            env={
                "DATABASE_URL": db_url,
                "CELERY_BROKER_URL": broker_url,
                "CELERY_BROKER_KEY_PREFIX": broker_prefix,
                **env,
            },
            with_triton=False,
        )
        try:
            stack.start()
            register = "; ".join(
                f"server_register(name='triton{i}', grpc_url='{h.grpc_url}', "
                f"gpu_memory_bytes={[gpu_bytes] * gpus_per_server})"
                for i, h in enumerate(handles)
            )
            stack.manage(
                "shell", "-c", f"from controlplane.fleet.membership.inventory import server_register; {register}"
            )
            key = stack.manage("tenant_create", "fleet-tenant").stdout.strip().splitlines()[-1]
            yield LocalFleet(stack, handles, db_url, key)
        finally:
            stack.stop()


@contextlib.contextmanager
def _tolerant(cm: contextlib.AbstractContextManager[LocalTriton]) -> Iterator[LocalTriton]:
    """Stopping a server that a test killed on purpose must not fail the teardown."""
    handle = cm.__enter__()
    try:
        yield handle
    finally:
        with contextlib.suppress(Exception):
            cm.__exit__(None, None, None)
