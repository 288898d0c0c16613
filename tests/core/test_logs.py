"""Structured logs: the formatters, the bound ids, the request middleware (request id, the URL's and the created
object's ids), the Celery task hooks, and the settings that choose the format."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest
from django.test import Client

from controlplane.core.observability import logs
from controlplane.core.observability.logs import (
    JsonFormatter,
    TextFormatter,
    gunicorn_logconfig_dict,
    log_context,
    log_context_bind,
    log_context_clear,
    logging_config,
    task_log_context_end,
    task_log_context_start,
)
from tests.support.batches import embedding_line, jsonl


@pytest.fixture(autouse=True)
def _clean_context():
    log_context_clear()
    yield
    log_context_clear()


def _record(message: str = "hello %s", *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    return logging.LogRecord("controlplane.x", logging.WARNING, __file__, 1, message, args or ("world",), exc_info)


def test_json_lines_carry_the_bound_ids_and_stay_one_line():
    log_context_bind(batch_id="batch_1", shard_index=3, attempt=2, slot=None)
    try:
        raise ValueError("bad\nthing")
    except ValueError as caught:
        line = JsonFormatter().format(_record(exc=caught))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "hello world"
    assert (entry["level"], entry["logger"]) == ("WARNING", "controlplane.x")
    assert (entry["batch_id"], entry["shard_index"], entry["attempt"]) == ("batch_1", 3, 2)
    assert "slot" not in entry  # None is not bound
    assert entry["timestamp"].endswith("+00:00") and entry["role"] and entry["pid"]
    assert "ValueError: bad\nthing" in entry["exception"]


def test_text_lines_stay_readable_with_the_ids_appended():
    formatter = TextFormatter()
    assert formatter.format(_record()).endswith("WARNING controlplane.x hello world")
    log_context_bind(batch_id="batch_1", shard_index=0)
    assert formatter.format(_record()).endswith("hello world batch_id=batch_1 shard_index=0")


def test_context_is_per_thread_and_tasks_start_clean():
    log_context_bind(batch_id="batch_main")
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(log_context()))
    thread.start()
    thread.join()
    assert seen == {}

    class Task:
        name = "batches.batch_validate"

    task_log_context_start(task_id="t-1", task=Task())
    assert log_context() == {"task": "batches.batch_validate", "task_id": "t-1"}
    log_context_bind(batch_id="batch_2")
    task_log_context_end()
    assert log_context() == {}


def test_the_settings_choose_the_formatter():
    config = logging_config(log_format="json", level="INFO")
    logging.captureWarnings(False)  # json's side effect (warnings become records); pytest keeps its own
    assert config["formatters"]["default"]["()"] == "controlplane.core.observability.logs.JsonFormatter"
    assert logging_config(log_format="text", level="INFO")["formatters"]["default"]["()"].endswith("TextFormatter")
    assert gunicorn_logconfig_dict("text") is None
    gunicorn = gunicorn_logconfig_dict("json")
    assert gunicorn is not None and gunicorn["loggers"]["gunicorn.error"]["propagate"] is False


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_celery_handlers_get_the_ids_in_either_format(settings, log_format):
    settings.LOG_FORMAT = log_format
    logger = logging.getLogger(f"celery-test-{log_format}")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(logging.Formatter("[%(levelname)s/MainProcess] %(message)s"))
    logger.addHandler(handler)
    logs.celery_logger_format(logger=logger)
    logs.celery_logger_format(logger=logger)  # a prefork child sets up again: wrapped once
    assert handler.formatter is not None
    log_context_bind(batch_id="batch_9")
    try:
        raise RuntimeError("boom")
    except RuntimeError as caught:
        line = handler.formatter.format(_record(exc=caught))
    if log_format == "json":
        assert json.loads(line)["batch_id"] == "batch_9"
    else:
        first, *rest = line.splitlines()
        assert first == "[WARNING/MainProcess] hello world batch_id=batch_9"  # Celery's format kept
        assert rest[-1] == "RuntimeError: boom"
        log_context_clear()
        assert handler.formatter.format(_record()) == "[WARNING/MainProcess] hello world"


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["/venv/bin/gunicorn", "controlplane.wsgi:application"], "web"),
        (["/venv/bin/celery", "-A", "controlplane", "worker", "-Q", "shards"], "worker"),
        (["/venv/bin/celery", "-A", "controlplane", "--quiet", "beat"], "beat"),
        (["manage.py", "migrate"], "manage"),
    ],
)
def test_the_process_role_comes_from_the_command_line(monkeypatch, argv, role):
    monkeypatch.delenv("LOG_PROCESS_ROLE", raising=False)
    monkeypatch.setattr(logs.sys, "argv", argv)
    assert logs.process_role() == role
    monkeypatch.setenv("LOG_PROCESS_ROLE", "orchestrator")
    assert logs.process_role() == "orchestrator"


@pytest.fixture
def captured():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("controlplane.requests")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def _entries(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


@pytest.mark.django_db
def test_requests_get_an_id_and_log_the_batch_they_created_or_read(tenant, captured, settings, monkeypatch):
    from controlplane.core.messaging import dispatch

    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)
    client = Client(HTTP_AUTHORIZATION=f"Bearer {tenant.raw_key}")
    upload = client.post(
        "/v1/files", {"purpose": "batch", "file": _file(jsonl([embedding_line("a", "x")]))}, HTTP_X_REQUEST_ID="my-id-1"
    )
    assert upload.status_code == 200 and upload["x-request-id"] == "my-id-1"
    created = client.post(
        "/v1/batches",
        {"input_file_id": upload.json()["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"},
        content_type="application/json",
        HTTP_X_REQUEST_ID="not a sane id\u2028",
    )
    assert created.status_code == 200, created.content
    batch_id = created.json()["id"]
    assert created["x-request-id"].startswith("req_")
    read = client.get(f"/v1/batches/{batch_id}")
    assert read.status_code == 200
    upload_line, create_line, read_line = _entries(captured)
    assert upload_line["request_id"] == "my-id-1" and upload_line["file_id"] == upload.json()["id"]
    assert create_line["message"].startswith("POST /v1/batches 200")
    assert create_line["batch_id"] == batch_id and create_line["request_id"] == created["x-request-id"]
    assert read_line["batch_id"] == batch_id and read_line["message"].startswith(f"GET /v1/batches/{batch_id} 200")
    assert log_context() == {}  # nothing leaks into what the thread logs next


def _file(content: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile("input.jsonl", content, content_type="application/jsonl")
