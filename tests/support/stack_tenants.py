"""Tenants on a running stack's database, made from the test process by the service `manage.py tenant_create`
calls (controlplane.tenants.services.tenant_create), not in a `manage.py` process: each of those was a Django
start of ~1.3 CPU-s, ~20 a suite run (docs/performance.md).

The service runs in a thread of its own whose default database connection is the stack's (Django keeps
connections per thread); pytest-django's database blocker, which stops tests without a database mark from
touching the test database, is lifted for that thread's work (tests/plugins/database.py hands it over)."""

from __future__ import annotations

import threading
from typing import Any

BLOCKER: Any = None  # pytest-django's django_db_blocker (tests/plugins/database.py, _stack_tenants_blocker)


def tenant_key(db_url: str, name: str) -> str:
    """A new tenant on the database at ``db_url``; its API key."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        import dj_database_url
        from django.db import connections
        from django.db.utils import load_backend

        from controlplane.tenants.services import tenant_create

        settings = connections.configure_settings({"default": dj_database_url.parse(db_url)})["default"]
        connection = load_backend(settings["ENGINE"]).DatabaseWrapper(settings, "default")
        connections["default"] = connection  # this thread's only
        try:
            outcome["key"] = tenant_create(name=name)[1]
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = exc
        finally:
            connection.close()

    if BLOCKER is None:
        raise RuntimeError(
            "tests/support/stack_tenants.py needs pytest-django's database blocker (tests/plugins/database.py)"
        )
    with BLOCKER.unblock():
        thread = threading.Thread(target=run, name="stack-tenant")
        thread.start()
        thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return str(outcome["key"])
