"""Structured logs: every line names the batch, shard, attempt and slot it is about, so one batch's story
can be read across web, worker and beat.

The ids travel in a context variable, bound where work on a batch starts (a request: core/http/request_log.py; a
Celery task: ``task_log_context_start`` below and one ``log_context_bind`` in the task or service; a shard
run: batches/run/execution.py) and read by the formatter, so no log call has to pass them. ``LOG_FORMAT=json``
writes one JSON object per line (timestamp, level, logger, message, role, pid, the bound ids, the
traceback); the default ``text`` stays a readable line with the ids appended as ``key=value``.

No Django at import time: gunicorn.conf.py imports this module in gunicorn's master, before any settings."""

from __future__ import annotations

import json
import logging
import os
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from controlplane.core.observability.tracing import current_ids

# The ids bound to the running request or task. An immutable snapshot per bind: a thread or task that binds
# never changes what another one sees.
_context: ContextVar[dict[str, object]] = ContextVar("controlplane_log_context", default={})  # noqa: B039 - never mutated

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def log_context_bind(**fields: object) -> None:
    """Add ids to everything this request or task logs from here on (None values are left out)."""
    _context.set({**_context.get(), **{key: value for key, value in fields.items() if value is not None}})


def log_context_clear() -> None:
    _context.set({})


def log_context() -> dict[str, object]:
    return _context.get()


def process_role() -> str:
    """web, worker, beat or manage: LOG_PROCESS_ROLE when set, else read from the command line."""
    role = os.environ.get("LOG_PROCESS_ROLE", "")
    if role:
        return role
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    if "gunicorn" in program or "runserver" in sys.argv:
        return "web"
    if "beat" in sys.argv:
        return "beat"
    if "worker" in sys.argv:
        return "worker"
    return "manage"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback is a string field, its newlines escaped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.role = process_role()

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "role": self.role,
            "pid": record.process,
        }
        entry.update(_context.get())
        entry.update(current_ids())  # the current span's trace_id and span_id (observability/tracing.py), when traced
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The readable line, with the bound ids appended (`` batch_id=batch_… shard_index=3``)."""

    def __init__(self, fmt: str | None = TEXT_FORMAT, *args: Any, **kwargs: Any) -> None:
        super().__init__(fmt, *args, **kwargs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record) + _bound_suffix()


def _bound_suffix() -> str:
    bound = _context.get()
    return "".join(f" {key}={value}" for key, value in bound.items())


class _CeleryTextFormatter(logging.Formatter):
    """Celery's own text formatter, kept (workers' lines look as Celery users expect), with the bound ids
    appended to the message like TextFormatter's."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        suffix = _bound_suffix()
        if not suffix:
            return self.inner.format(record)
        first, newline, rest = self.inner.format(record).partition("\n")
        return first + suffix + newline + rest  # on the first line, before a traceback


def logging_config(*, log_format: str, level: str) -> dict[str, Any]:
    """settings.LOGGING: the root logger to stderr in the chosen format."""
    if log_format == "json":
        # Python warnings (deprecations at start-up) become records too: no stray non-JSON line on stderr.
        logging.captureWarnings(True)
    formatter_class = JsonFormatter if log_format == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": {"()": f"{__name__}.{formatter_class.__name__}"}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "default"}},
        "root": {"handlers": ["console"], "level": level},
    }


def celery_logger_format(logger: logging.Logger | None = None, **_: Any) -> None:
    """after_setup_logger / after_setup_task_logger: Celery installs its own handlers on the root and task
    loggers (in each prefork child too). With LOG_FORMAT=json they get the JSON formatter, like web's; with
    text Celery's format stays and the bound ids are appended."""
    if logger is None:
        return
    from django.conf import settings

    for handler in logger.handlers:
        current = handler.formatter
        if settings.LOG_FORMAT == "json":
            handler.setFormatter(JsonFormatter())
        elif current is not None and not isinstance(current, _CeleryTextFormatter | TextFormatter):
            handler.setFormatter(_CeleryTextFormatter(current))


def task_log_context_start(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """task_prerun: each task starts with only its own name and id bound (a thread of the pool runs many)."""
    _context.set({"task": getattr(task, "name", None) or "", "task_id": task_id or ""})


def task_log_context_end(**_: Any) -> None:
    """task_postrun: nothing bound by the task leaks into what the thread logs next."""
    log_context_clear()


def gunicorn_logconfig_dict(log_format: str) -> dict[str, Any] | None:
    """gunicorn's own loggers (its start-up and error lines) in the chosen format: gunicorn.conf.py's
    ``logconfig_dict`` for json, None (gunicorn's defaults) for text."""
    if log_format != "json":
        return None
    formatter = {"()": f"{__name__}.JsonFormatter"}
    # Not propagated: the root logger's handler (Django's LOGGING, once the app loads) would print them twice.
    loggers = {
        name: {"level": "INFO", "handlers": [handler], "propagate": False, "qualname": name}
        for name, handler in (("gunicorn.error", "error_console"), ("gunicorn.access", "console"))
    }
    return {"formatters": {"generic": formatter}, "loggers": loggers}
