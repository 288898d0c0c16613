"""Exit codes and the one place that turns API failures into a message instead of a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import typer
from rich.markup import escape

from batchctl.config import ConfigError
from batchctl.console import err

if TYPE_CHECKING:
    import openai

# Exit codes (README, "CLI"): scripts tell a refused request from a batch that ended badly.
EXIT_OK = 0
EXIT_API_ERROR = 1  # the API refused the request or could not be reached
EXIT_UNSUPPORTED = 2  # also click's code for a bad command line; here: the server lacks the feature
EXIT_BATCH_NOT_COMPLETED = 3  # the batch ended failed, expired or cancelled
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention for Ctrl-C

P = ParamSpec("P")
R = TypeVar("R")


class APIRefused(Exception):
    """The API refused a request made without the SDK (batchctl follow); the text is error_text's."""


def error_text(status_code: int, body: dict[str, Any], text: str, *, fallback: str = "", code: Any = None) -> str:
    """The server's own message and code (OpenAI's error shape), not the SDK's "Error code: 409 - {...}"."""
    message = body.get("message") or text.strip() or fallback or f"HTTP {status_code}"
    code = body.get("code") or code
    detail = f"HTTP {status_code}" + (f", code {code}" if code else "")
    return f"{message} ({detail})"


def api_error_text(error: openai.APIStatusError) -> str:
    body = error.body if isinstance(error.body, dict) else {}
    return error_text(error.status_code, body, error.response.text, fallback=error.message, code=error.code)


def fail(message: str, code: int = EXIT_API_ERROR) -> typer.Exit:
    """Print ``message`` to stderr and return the Exit to raise (``raise fail(...)`` reads as a return)."""
    err.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


def reports_api_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command so API and configuration errors exit 1 with one readable line on stderr."""

    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except (ConfigError, APIRefused) as error:
            raise fail(str(error)) from None
        except Exception as error:
            # The SDK is imported by the commands that use it, not at start (`batchctl follow` never does): when
            # it was not imported, no error of its can have been raised.
            openai = sys.modules.get("openai")
            if openai is not None and isinstance(error, openai.APIStatusError):
                raise fail(api_error_text(error)) from None
            if openai is not None and isinstance(error, openai.APIConnectionError):
                url = error.request.url if error.request is not None else "the API"
                raise fail(f"cannot reach {url}: {error.__cause__ or error}") from None
            raise

    return wrapper
