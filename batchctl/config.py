"""Where the API is and which key to use: options first, then the environment, like the openai CLI."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openai import OpenAI

# `make serve` listens here (scripts/serve.py, PORT defaults to 8000).
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
KEY_VARIABLES = ("BATCHCTL_API_KEY", "OPENAI_API_KEY")
URL_VARIABLES = ("BATCHCTL_BASE_URL", "OPENAI_BASE_URL")
# Seconds for one request; uploads and downloads stream, so this bounds a stall, not a transfer.
REQUEST_TIMEOUT_SECONDS = 120.0


class ConfigError(Exception):
    """The client cannot be built: no key anywhere."""


@dataclass(frozen=True)
class Settings:
    api_key: str
    base_url: str


def _first(environ: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return value
    return None


def settings_resolve(*, api_key: str | None, base_url: str | None, environ: Mapping[str, str]) -> Settings:
    """An option wins over BATCHCTL_*, which wins over OPENAI_* (so one shell can hold keys for both)."""
    key = api_key or _first(environ, KEY_VARIABLES)
    if not key:
        raise ConfigError(f"No API key: pass --api-key or set {' or '.join(KEY_VARIABLES)}.")
    url = base_url or _first(environ, URL_VARIABLES) or DEFAULT_BASE_URL
    return Settings(api_key=key, base_url=url.rstrip("/"))


def client_create(settings: Settings) -> OpenAI:
    from openai import OpenAI  # ~0.5-0.7 s of CPU: only the commands that use the SDK pay for it

    # The usage API is an admin endpoint in the SDK; on this service a tenant's own key reads its usage.
    return OpenAI(
        api_key=settings.api_key,
        admin_api_key=settings.api_key,
        base_url=settings.base_url,
        timeout=REQUEST_TIMEOUT_SECONDS,
    )
