"""The test databases: each worker's copied from the migrated template, flushed cheaply after a transactional test
(tests/plugins/flush.py), reachable by the stack tenants' helper past pytest-django's blocker; and the guard that
keeps a ``row_locks`` test off SQLite."""

from __future__ import annotations

import pytest

from tests.plugins import with_django


def pytest_configure(config: pytest.Config) -> None:
    if with_django(config):
        from tests.plugins import flush

        flush.install()


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> None:
    """pytest-django's per-worker test database (the xdist suffix, as its own fixture does), copied on Postgres
    from the migrated template (deploy/local/databases.py) rather than migrated from empty in each worker: its
    `migrate` then finds nothing to do."""
    from django.conf import settings

    from deploy.local.databases import migrated_template

    database = settings.DATABASES["default"]
    if database["ENGINE"] != "django.db.backends.postgresql":
        return
    admin_url = f"postgresql://{database['USER']}@{database['HOST']}:{database['PORT'] or 5432}/postgres"
    database.setdefault("TEST", {})["TEMPLATE"] = migrated_template(admin_url)


@pytest.fixture(scope="session", autouse=True)
def _stack_tenants_blocker(request: pytest.FixtureRequest) -> None:
    """tests/support/stack_tenants.py makes tenants on running stacks' databases from this process, past
    pytest-django's database blocker: it gets the blocker."""
    if with_django(request.config):
        from tests.support import stack_tenants

        stack_tenants.BLOCKER = request.getfixturevalue("django_db_blocker")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``row_locks`` test checks a guard that only Postgres' row locks give (SELECT … FOR UPDATE SKIP LOCKED):
    on SQLite, which has none, it would prove nothing, so it refuses to run and says why."""
    if item.get_closest_marker("row_locks") is None:
        return
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip(
            f"row_locks: needs Postgres row locks, this run's database is {connection.vendor} "
            "(set DATABASE_URL to Postgres; make test does)"
        )
