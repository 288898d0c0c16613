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
