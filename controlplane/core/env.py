"""Typed environment readers that fail loudly on a bad value, and the registry of what they read.

Settings call these so that a typo in a deployment's environment stops the process at start-up with
an ImproperlyConfigured naming the variable, instead of surfacing later as odd behaviour. Each reader takes
the variable's meaning (``help``) and records the variable in ``VARIABLES``, from which
scripts/config_reference.py writes docs/operations/configuration.md; ``env_declare`` lists a variable that
other code reads itself (a library, a process before Django starts).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Variable:
    """One environment variable as the configuration reference lists it."""

    name: str
    kind: str  # the values it takes, in words: "integer ≥ 1", "one of: fair, fifo"
    default: object  # the typed default; None: unset
    meaning: str
    module: str  # the module that reads or declares it: its area in the reference


VARIABLES: dict[str, Variable] = {}


def _record(name: str, kind: str, default: object, meaning: str) -> None:
    # The area is the module that called the reader, the first frame outside this one: a settings module
    # stays a list of plain assignments, with no area to repeat on each line.
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    VARIABLES[name] = Variable(name, kind, default, meaning, str(frame.f_globals.get("__name__", "")))


def env_declare(name: str, default: object, *, kind: str, help: str) -> None:
    """List a variable that is read elsewhere (by a library, or by code that runs before settings load)."""
    _record(name, kind, default, help)


def env_str(name: str, default: str, *, help: str) -> str:
    """An unset or empty variable means the default, so `FOO= cmd` resets FOO."""
    _record(name, "string", default, help)
    return os.environ.get(name) or default


def env_int(name: str, default: int, *, minimum: int | None = None, help: str) -> int:
    _record(name, "integer" if minimum is None else f"integer ≥ {minimum}", default, help)
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


def env_float(name: str, default: float, *, help: str) -> float:
    _record(name, "number", default, help)
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from exc


def env_bool(name: str, default: bool, *, help: str) -> bool:
    _record(name, "boolean", default, help)
    raw = os.environ.get(name)
    if raw is None:
        return default
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def _items(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_list(name: str, default: list[str], *, help: str) -> list[str]:
    _record(name, "comma-separated list", default, help)
    items = _items(name)
    return list(default) if items is None else items


def env_int_list(name: str, default: list[int], *, minimum: int, maximum: int, help: str) -> list[int]:
    """Comma-separated integers in [minimum, maximum] (e.g. WEBHOOK_EXTRA_PORTS=8443,9443)."""
    _record(name, f"comma-separated integers in {minimum}..{maximum}", default, help)
    items = _items(name)
    if items is None:
        return list(default)
    values = []
    for item in items:
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


def env_choice(name: str, default: str, choices: tuple[str, ...], *, help: str) -> str:
    _record(name, f"one of: {', '.join(choices)}", default, help)
    value = os.environ.get(name) or default
    if value not in choices:
        raise ImproperlyConfigured(f"{name} must be one of {', '.join(choices)}; got {value!r}.")
    return value


def env_pair(name: str, *, help: str) -> tuple[str, str] | None:
    """Two comma-separated values (e.g. SECURE_PROXY_SSL_HEADER=HTTP_X_FORWARDED_PROTO,https), or None."""
    _record(name, "two comma-separated values", None, help)
    items = _items(name)
    if items is None:
        return None
    if len(items) != 2:
        raise ImproperlyConfigured(f"{name} must be two comma-separated values, got {os.environ.get(name)!r}")
    return items[0], items[1]


# The file the local runner (deploy/local/stack.py) writes its generated key to, inside the var dir.
SECRET_KEY_FILENAME = "secret_key"
# Public (it is in this file): good enough to sign a developer's DEBUG session, never anything else.
EMBEDDED_SECRET_KEY = "embedded-default-not-for-production"


def env_secret_key(name: str, *, key_file: Path, debug: bool, help: str) -> str:
    """The signing key: the variable ``name``, else the local runner's generated ``key_file``, else (only with
    DEBUG) the public embedded key. Anything else refuses to start.

    Why a file and not "generate on first use" here: every process (gunicorn workers, Celery, beat,
    ``manage.py``) must agree on one key, and a key invented by whichever process starts first in a
    production container would differ per pod and be lost with it, silently. So only the local runner
    creates the file (``make serve`` / ``make demo``, mode 0600, once per var dir) and hands it to its
    children as ``name``; a ``manage.py`` run next to it (``manage.py tenant_create`` after ``make serve``)
    reads the same file. Production sets ``name`` and has no such file, so a missing key is an error.
    """
    _record(name, "string (secret)", None, help)
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
