"""Exit codes and the one place that turns API failures into a message instead of a traceback."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import openai
import typer
from rich.markup import escape

from batchctl.config import ConfigError
from batchctl.console import err

# Exit codes (README, "CLI"): scripts tell a refused request from a batch that ended badly.
EXIT_OK = 0
EXIT_API_ERROR = 1  # the API refused the request or could not be reached
EXIT_UNSUPPORTED = 2  # also click's code for a bad command line; here: the server lacks the feature
EXIT_BATCH_NOT_COMPLETED = 3  # the batch ended failed, expired or cancelled
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention for Ctrl-C

P = ParamSpec("P")
R = TypeVar("R")


def api_error_text(error: openai.APIStatusError) -> str:
    """The server's own message and code (OpenAI's error shape), not the SDK's "Error code: 409 - {...}"."""
    body = error.body if isinstance(error.body, dict) else {}
    message = body.get("message") or error.response.text.strip() or error.message
    code = body.get("code") or error.code
    detail = f"HTTP {error.status_code}" + (f", code {code}" if code else "")
    return f"{message} ({detail})"


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
        except ConfigError as error:
            raise fail(str(error)) from None
        except openai.APIStatusError as error:
            raise fail(api_error_text(error)) from None
        except openai.APIConnectionError as error:
            url = error.request.url if error.request is not None else "the API"
            raise fail(f"cannot reach {url}: {error.__cause__ or error}") from None

    return wrapper
