"""Secure by default: no public signing key outside DEBUG, the local runner's generated key, the admin's
headers, and `manage.py check --deploy` clean with the production settings documented in README."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.core.env import EMBEDDED_SECRET_KEY, SECRET_KEY_FILENAME
from deploy.local.stack import Stack
from deploy.local.supervision import secret_key_ensure

REPO_ROOT = Path(__file__).resolve().parents[1]

# README, "Production settings" (keep the two in step).
PRODUCTION_ENV = {
    "DJANGO_SECRET_KEY": "a" * 10 + "-production-key-from-the-secret-store-0123456789abcdefghijklmnop",
    "DJANGO_ALLOWED_HOSTS": "batch.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://batch.example.com",
    "SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO,https",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
}


def _manage(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """manage.py in a fresh process on the service's settings, with none of this run's key or debug."""
    child = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SECRET_KEY", "DJANGO_DEBUG"}}
    child.update(DJANGO_SETTINGS_MODULE="controlplane.settings", CONTROLPLANE_VAR_DIR=str(tmp_path), **env)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT,
        env=child,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_without_a_key_outside_debug_nothing_starts(tmp_path):
    done = _manage(tmp_path, "check")
    assert done.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in done.stderr
    assert str(tmp_path / SECRET_KEY_FILENAME) in done.stderr  # says where the local runner's key goes


def test_the_public_embedded_key_is_refused_outside_debug(tmp_path):
    done = _manage(tmp_path, "check", DJANGO_SECRET_KEY=EMBEDDED_SECRET_KEY)
    assert done.returncode != 0 and "DJANGO_SECRET_KEY is the public embedded default" in done.stderr


def test_debug_runs_on_the_embedded_key(tmp_path):
    done = _manage(tmp_path, "check", DJANGO_DEBUG="1")
    assert done.returncode == 0, done.stderr


def test_local_runner_key_is_generated_once_private_and_read_by_manage_py(tmp_path):
    key = secret_key_ensure(tmp_path)
    path = tmp_path / SECRET_KEY_FILENAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) >= 50 and secret_key_ensure(tmp_path) == key  # once per var dir
    stack = Stack(var_dir=tmp_path)
    assert stack.child_env()["DJANGO_SECRET_KEY"] == key
    assert stack.child_env()["DJANGO_SETTINGS_MODULE"] == "controlplane.settings"
    # A caller's own key wins over the file.
    assert Stack(var_dir=tmp_path, env={"DJANGO_SECRET_KEY": "mine"}).child_env()["DJANGO_SECRET_KEY"] == "mine"
    # `manage.py …` by hand next to `make serve`: no variable needed, the file is read.
    done = _manage(tmp_path, "shell", "-c", "from django.conf import settings; print(settings.SECRET_KEY)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == key


def test_check_deploy_passes_with_the_documented_production_settings(tmp_path):
    done = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **PRODUCTION_ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    readme = (REPO_ROOT / "README.md").read_text()
    for name in PRODUCTION_ENV:
        assert f"{name}=" in readme, f"README's production settings lack {name}"


def test_check_deploy_flags_the_embedded_defaults(tmp_path):
    done = _manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", DJANGO_SECRET_KEY="x" * 60)
    assert done.returncode != 0
    for check in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert check in done.stderr


@pytest.mark.django_db
def test_admin_is_never_framed(client):
    response = client.get("/admin/login/")
    assert response.status_code == 200
    assert response["X-Frame-Options"] == "DENY"


@pytest.mark.django_db
def test_with_the_https_redirect_on_only_in_cluster_paths_answer_plain_http(settings):
    from django.test import Client

    settings.SECURE_SSL_REDIRECT = True  # as compose and both overlays ship it
    client = Client()  # a new handler: SecurityMiddleware reads the settings when it is built
    assert client.get("/v1/batches").status_code == 301
    assert client.get("/admin/login/").status_code == 301
    # Probes, Prometheus and the Triton fleet agent talk plain http inside the cluster, without the proxy.
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code != 301
    assert client.post("/internal/fleet/servers", {}).status_code != 301
