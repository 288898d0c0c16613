from __future__ import annotations

import pytest


@pytest.fixture
def catalogue(db):
    # transaction=True tests flush tables, data migrations included; put the shipped models back.
    from controlplane.fleet.services import catalogue_seed_defaults

    catalogue_seed_defaults()


@pytest.fixture
def tenant(db, catalogue):
    from controlplane.tenants.services import tenant_create

    tenant, key = tenant_create(name="tenant-a")
    tenant.raw_key = key
    return tenant


@pytest.fixture
def other_tenant(db):
    from controlplane.tenants.services import tenant_create

    tenant, key = tenant_create(name="tenant-b")
    tenant.raw_key = key
    return tenant


@pytest.fixture
def api(tenant):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")
    return client


@pytest.fixture(autouse=True)
def storage_dir(tmp_path, settings):
    """Every test stores blobs in its own directory (Django resets its storages on this change)."""
    location = tmp_path / "storage"
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(location)}},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    return location


@pytest.fixture(autouse=True)
def fresh_queue_rankings():
    """Queue positions shown to clients reuse a ranking for up to a second (scheduling/selectors.py): no test
    sees another test's."""
    from controlplane.scheduling import selectors

    selectors._rankings.clear()


# `make test` runs the suite in pytest-xdist workers with --dist loadgroup. Tests that share an expensive
# session fixture go to one worker as a group, so each fixture starts once, not once per worker: the
# end-to-end stack (gunicorn, workers, beat, a tritonserver), the chaos suite's own stacks (they kill and restart
# processes, so they run apart from the shared stack), and tests on the session tritonserver. Everything else
# spreads over all workers.
_CHAOS_DIR = "tests/chaos/"


def _xdist_group(item: pytest.Item) -> str | None:
    path = item.nodeid
    if path.startswith(_CHAOS_DIR):
        return "chaos"
    if item.get_closest_marker("e2e") is not None:
        return "stack"
    if "triton_server" in getattr(item, "fixturenames", ()):
        return "triton"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="`make test-fast`: leave out what starts processes (the stack, chaos, a tritonserver)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    fast, kept, left_out = config.getoption("--fast"), [], []
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        (left_out if fast and group is not None else kept).append(item)
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept
