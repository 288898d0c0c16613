"""Settings for the test run: the service's settings with a signing key of the run's own.

pytest-django loads settings before any conftest.py runs, so the key cannot be set from a fixture; a
settings module is the standard place (mypy's django-stubs plugin imports this one too). The key is random per run and is taken out of os.environ again,
so processes the tests start (the local runner's children, `manage.py` subprocesses) go through the
same key resolution as users' do (deploy/local/stack.py generates var/secret_key).
"""

from __future__ import annotations

import os
import secrets

_had_key = bool(os.environ.get("DJANGO_SECRET_KEY"))
if not _had_key:
    os.environ["DJANGO_SECRET_KEY"] = "tests-" + secrets.token_urlsafe(48)
try:
    from controlplane.settings import *  # noqa: F403
finally:
    if not _had_key:
        del os.environ["DJANGO_SECRET_KEY"]
