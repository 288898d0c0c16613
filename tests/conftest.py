from __future__ import annotations

import pytest

from tests.plugins import with_django

# The suite's machinery (tests/plugins): xdist groups and `--fast`, the test databases and their flush, and with
# SUITE_CPU_LOG=<dir> the CPU seconds of each test (off otherwise).
pytest_plugins = ["tests.plugins.scheduling", "tests.plugins.database", "tests.plugins.cpu_ledger"]


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
def storage_dir(request, tmp_path):
    """Every test stores blobs in its own directory (Django resets its storages on this change)."""
    location = tmp_path / "storage"
    if not with_django(request.config):
        return location
    settings = request.getfixturevalue("settings")
    settings.STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(location)}},
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    return location


@pytest.fixture(autouse=True)
def fresh_queue_rankings(request):
    """Queue positions shown to clients reuse a ranking for up to a second (scheduling/selectors.py): no test
    sees another test's."""
    if not with_django(request.config):
        return
    from controlplane.scheduling import selectors

    selectors._rankings.clear()
