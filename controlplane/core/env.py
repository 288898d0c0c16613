"""Typed environment readers that fail loudly on a bad value.

Settings call these so that a typo in a deployment's environment stops the process at start-up with
an ImproperlyConfigured naming the variable, instead of surfacing later as odd behaviour.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    """An unset or empty variable means the default, so `FOO= cmd` resets FOO."""
    return os.environ.get(name) or default


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be >= {minimum}, got {value}")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int_list(name: str, default: list[int], *, minimum: int, maximum: int) -> list[int]:
    """Comma-separated integers in [minimum, maximum] (e.g. WEBHOOK_EXTRA_PORTS=8443,9443)."""
    values = []
    for item in env_list(name, [str(value) for value in default]):
        try:
            value = int(item)
        except ValueError as exc:
            raise ImproperlyConfigured(
                f"{name} must be comma-separated integers, got {os.environ.get(name)!r}"
            ) from exc
        if not minimum <= value <= maximum:
            raise ImproperlyConfigured(f"{name}: {value} is outside {minimum}..{maximum}")
        values.append(value)
    return values


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env_str(name, default)
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}; got {value!r}.")
    return value


def env_pair(name: str) -> tuple[str, str] | None:
    """Two comma-separated values (e.g. SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https), or None."""
    items = env_list(name, [])
    if not items:
        return None
    if len(items) != 2:
        raise ImproperlyConfigured(f"{name} must be two comma-separated values, got {os.environ.get(name)!r}")
    return items[0], items[1]


# The file the local runner (deploy/local/stack.py) writes its generated key to, inside the var dir.
SECRET_KEY_FILENAME = "secret_key"
# Public (it is in this file): good enough to sign a developer's DEBUG session, never anything else.
EMBEDDED_SECRET_KEY = "embedded-default-not-for-production"


def env_secret_key(name: str, *, key_file: Path, debug: bool) -> str:
    """The signing key: the variable ``name``, else the local runner's generated ``key_file``, else (only with
    DEBUG) the public embedded key. Anything else refuses to start.

    Why a file and not "generate on first use" here: every process (gunicorn workers, Celery, beat,
    ``manage.py``) must agree on one key, and a key invented by whichever process starts first in a
    production container would differ per pod and be lost with it, silently. So only the local runner
    creates the file (``make serve`` / ``make demo``, mode 0600, once per var dir) and hands it to its
    children as ``name``; a ``manage.py`` run next to it (``manage.py tenant_create`` after ``make serve``)
    reads the same file. Production sets ``name`` and has no such file, so a missing key is an error.
    """
    value = os.environ.get(name, "").strip()
    if not value:
        try:
            value = key_file.read_text().strip()
        except FileNotFoundError:
            value = ""
    if not value and debug:
        return EMBEDDED_SECRET_KEY
    if not value:
        raise ImproperlyConfigured(
            f"{name} is not set. Outside DEBUG the service refuses to run without a private key: set {name} to "
            f"a long random value (python -c 'import secrets; print(secrets.token_urlsafe(50))'), or start the "
            f"local runner (make serve), which generates one in {key_file}."
        )
    if value == EMBEDDED_SECRET_KEY and not debug:
        raise ImproperlyConfigured(f"{name} is the public embedded default; set it to a private random value.")
    return value
