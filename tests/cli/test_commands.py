"""Each command in-process (typer's runner) against a small real HTTP server answering like the service."""

from __future__ import annotations

import json

import pytest

from tests.cli.fake_api import Reply, batch_json, error_json

OUTPUT = b'{"custom_id": "a"}\n{"custom_id": "b"}\n'
ERRORS = b'{"custom_id": "c"}\n'


def _file(file_id: str, size: int = 10) -> Reply:
    return Reply(
        body={
            "id": file_id,
            "object": "file",
            "bytes": size,
            "created_at": 1,
            "filename": "in.jsonl",
            "purpose": "batch",
            "status": "processed",
        }
    )


def test_status_panel_shows_counts_priority_queue_and_errors(cli, fake_api, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # the queue line fits on one line of the panel
    queue = {"position": 2, "runnable_batches": 5, "estimated_start_at": 1764500060, "deadline_at_risk": True}
    fake_api.on(
        "GET", "/batches/batch_1", Reply(body=batch_json(done=30, failed=2, total=64, priority="high", queue=queue))
    )
    result = cli("status", "batch_1")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "in_progress" in text and "30 done, 2 failed of 64 (50%)" in text
    assert "high" in text
    assert "position 2 of 5, estimated start 2025-11-30 10:54:20 UTC, deadline at risk" in text


def test_status_of_a_failed_batch_lists_its_validation_errors(cli, fake_api):
    errors = {"object": "list", "data": [{"code": "invalid_json_line", "line": 3, "message": "Line 3 is not JSON."}]}
    fake_api.on("GET", "/batches/batch_1", Reply(body=batch_json(status="failed", errors=errors)))
    result = cli("status", "batch_1")
    assert "line 3: Line 3 is not JSON. (invalid_json_line)" in result.stdout


def test_status_json_is_the_object_as_sent_extra_fields_included(cli, fake_api):
    fake_api.on("GET", "/batches/batch_1", Reply(body=batch_json(priority="low", rerun_of="batch_0")))
    result = cli("status", "batch_1", "--json")
    body = json.loads(result.stdout)
    assert body["id"] == "batch_1" and body["priority"] == "low" and body["rerun_of"] == "batch_0"


def test_list_filters_by_status_across_pages_and_stops_at_the_limit(cli, fake_api):
    page1 = [batch_json(f"batch_{i}", status="completed" if i % 2 else "failed") for i in range(1, 5)]
    page2 = [batch_json(f"batch_{i}", status="completed") for i in range(5, 9)]
    fake_api.on(
        "GET",
        "/batches",
        Reply(body={"object": "list", "data": page1, "has_more": True, "first_id": "batch_1", "last_id": "batch_4"}),
        Reply(body={"object": "list", "data": page2, "has_more": False, "first_id": "batch_5", "last_id": "batch_8"}),
    )
    result = cli("list", "--status", "completed", "--limit", "3", "--json")
    assert result.exit_code == 0, result.output
    assert [b["id"] for b in json.loads(result.stdout)] == ["batch_1", "batch_3", "batch_5"]
    first, second = fake_api.requests("GET", "/batches")
    assert first.query == {"limit": ["100"]} and second.query["after"] == ["batch_4"]


@pytest.mark.parametrize("columns", [80, 120])
def test_list_table_keeps_id_status_and_lines_on_a_batchs_first_line(cli, fake_api, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    first_id, second_id = "batch_" + "a" * 24, "batch_" + "b" * 24  # the service's ids: prefix + 24 hex
    rows = [
        batch_json(first_id, done=3, failed=1, total=4, model="all-MiniLM-L6-v2"),
        batch_json(second_id, status="completed", total=0),
    ]
    fake_api.on("GET", "/batches", Reply(body={"object": "list", "data": rows, "has_more": False}))
    lines = cli("list").stdout.splitlines()
    [first] = [line for line in lines if first_id in line]
    [second] = [line for line in lines if second_id in line]
    assert "in_progress" in first and "4/4 (1 failed)" in first and "2025-11-30 10:53" in first
    assert "completed" in second and "0/0" in second
    if columns >= 100:  # narrower, rich gives the model and priority columns up first
        assert lines[0].split() == ["ID", "STATUS", "MODEL", "PRIORITY", "LINES", "CREATED", "(UTC)"]
        assert len(lines) == 3 and "all-MiniLM-L6-v2" in first and "normal" in first


def test_an_api_error_prints_the_servers_message_and_code_and_exits_1(cli, fake_api):
    message = "Batch batch_1 has no failed lines to re-run."
    fake_api.on("POST", "/batches/batch_1/rerun", Reply(409, error_json(message, "conflict")))
    result = cli("retry-failed", "batch_1")
    assert result.exit_code == 1
    assert message in result.stderr and "HTTP 409, code conflict" in result.stderr
    assert "Traceback" not in result.output


def test_retry_failed_sends_the_codes_with_an_idempotency_key_and_can_wait(cli, fake_api, tmp_path):
    fake_api.on("POST", "/batches/batch_1/rerun", Reply(body=batch_json("batch_2", status="validating")))
    fake_api.on(
        "GET",
        "/batches/batch_2",
        Reply(body=batch_json("batch_2", status="completed", done=1, total=1, output_file_id="file-out")),
    )
    fake_api.on("GET", "/files/file-out/content", Reply(body=b'{"custom_id": "c"}\n'))
    result = cli(
        "retry-failed",
        "batch_1",
        "--error-code",
        "timeout",
        "--error-code",
        "unavailable",
        "--wait",
        "--poll-interval",
        "0.1",
        "-o",
        str(tmp_path),
    )
    assert result.exit_code == 0, result.output
    [request] = fake_api.requests("POST", "/batches/batch_1/rerun")
    assert json.loads(request.body) == {"error_codes": ["timeout", "unavailable"]}
    assert request.headers["idempotency-key"].startswith("batchctl-")
    assert (tmp_path / "batch_2_output.jsonl").read_bytes() == b'{"custom_id": "c"}\n'


def test_cancel(cli, fake_api):
    fake_api.on("POST", "/batches/batch_1/cancel", Reply(body=batch_json(status="cancelling")))
    result = cli("cancel", "batch_1")
    assert result.exit_code == 0 and "batch_1: cancelling" in result.stdout


def test_download_streams_both_files_into_the_directory(cli, fake_api, tmp_path):
    ended = batch_json(status="completed", output_file_id="file-out", error_file_id="file-err")
    fake_api.on("GET", "/batches/batch_1", Reply(body=ended))
    fake_api.on("GET", "/files/file-out/content", Reply(body=OUTPUT))
    fake_api.on("GET", "/files/file-err/content", Reply(body=ERRORS))
    result = cli("download", "batch_1", "--output-dir", str(tmp_path / "results"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "results" / "batch_1_output.jsonl").read_bytes() == OUTPUT
    assert (tmp_path / "results" / "batch_1_errors.jsonl").read_bytes() == ERRORS
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["batch_1_errors.jsonl", "batch_1_output.jsonl"]
    assert f"({len(OUTPUT)} bytes)" in result.stdout


def test_download_of_a_running_batch_is_refused(cli, fake_api, tmp_path):
    fake_api.on("GET", "/batches/batch_1", Reply(body=batch_json(status="in_progress")))
    result = cli("download", "batch_1", "-o", str(tmp_path))
    assert result.exit_code == 1 and "is in_progress" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_failed_download_leaves_no_file_behind(cli, fake_api, tmp_path):
    fake_api.on("GET", "/batches/batch_1", Reply(body=batch_json(status="completed", output_file_id="file-out")))
    fake_api.on("GET", "/files/file-out/content", Reply(404, error_json("No such file: file-out.", "not_found")))
    result = cli("download", "batch_1", "-o", str(tmp_path))
    assert result.exit_code == 1 and "No such file" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"custom_id": "a"}\n{"custom_id": "b"}\n{"custom_id": "c"}\n')
    return path


def _script_submit(fake_api, *states: dict) -> None:
    fake_api.on("POST", "/files", _file("file-in", 57))
    fake_api.on("POST", "/batches", Reply(body=batch_json(status="validating")))
    fake_api.on("GET", "/batches/batch_1", *(Reply(body=state) for state in states))
    fake_api.on("GET", "/files/file-out/content", Reply(body=OUTPUT))
    fake_api.on("GET", "/files/file-err/content", Reply(body=ERRORS))


def test_submit_wait_follows_progress_downloads_and_exits_0(cli, fake_api, input_file, tmp_path):
    _script_submit(
        fake_api,
        batch_json(status="in_progress", done=1, total=3),
        batch_json(status="completed", done=2, failed=1, total=3, output_file_id="file-out", error_file_id="file-err"),
    )
    out_dir = tmp_path / "out"
    args = ["submit", str(input_file), "--endpoint", "/v2/infer", "--priority", "high", "--metadata", "team=ml"]
    result = cli(*args, "--wait", "--poll-interval", "0.1", "--output-dir", str(out_dir))
    assert result.exit_code == 0, result.output
    [upload] = fake_api.requests("POST", "/files")
    assert b'name="purpose"\r\n\r\nbatch' in upload.body and input_file.read_bytes() in upload.body
    [create] = fake_api.requests("POST", "/batches")
    assert json.loads(create.body) == {
        "input_file_id": "file-in",
        "endpoint": "/v2/infer",
        "completion_window": "24h",
        "metadata": {"team": "ml"},
        "priority": "high",
    }
    assert upload.headers["idempotency-key"] != create.headers["idempotency-key"]
    assert "in_progress: 1/3 lines (33%)" in result.stdout and "completed: 3/3 lines (100%), 1 failed" in result.stdout
    assert "re-run the failed lines with: batchctl retry-failed batch_1" in result.stdout
    assert (out_dir / "batch_1_output.jsonl").read_bytes() == OUTPUT
    assert (out_dir / "batch_1_errors.jsonl").read_bytes() == ERRORS


def test_a_refused_create_deletes_the_upload_and_exits_1(cli, fake_api, input_file):
    fake_api.on("POST", "/files", _file("file-in", 57))
    refusal = "priority 'high' is above the highest class allowed for this tenant, 'normal'."
    fake_api.on("POST", "/batches", Reply(400, error_json(refusal, "priority_not_allowed")))
    fake_api.on("DELETE", "/files/file-in", Reply(body={"id": "file-in", "object": "file", "deleted": True}))
    result = cli("submit", str(input_file), "--endpoint", "/v2/infer", "--priority", "high")
    assert result.exit_code == 1
    assert refusal in result.stderr and "code priority_not_allowed" in result.stderr
    assert len(fake_api.requests("DELETE", "/files/file-in")) == 1


def test_submit_without_wait_returns_at_once(cli, fake_api, input_file):
    _script_submit(fake_api)
    result = cli("submit", str(input_file), "--endpoint", "/v1/embeddings")
    assert result.exit_code == 0 and "created batch_1 (validating)" in result.stdout
    assert fake_api.requests("GET", "/batches/batch_1") == []


def test_submit_wait_on_a_batch_that_fails_validation_exits_3_with_its_errors(cli, fake_api, input_file, tmp_path):
    errors = {
        "object": "list",
        "data": [{"code": "duplicate_custom_id", "line": 2, "message": "custom_id 'a' repeats line 1."}],
    }
    _script_submit(fake_api, batch_json(status="failed", errors=errors))
    result = cli("submit", str(input_file), "--endpoint", "/v2/infer", "--wait", "-o", str(tmp_path / "o"))
    assert result.exit_code == 3
    assert "batch batch_1 failed" in result.stderr and "line 2: custom_id 'a' repeats line 1." in result.stderr


def test_submit_wait_on_a_cancelled_batch_keeps_what_finished_and_exits_3(cli, fake_api, input_file, tmp_path):
    _script_submit(fake_api, batch_json(status="cancelled", done=2, total=3, output_file_id="file-out"))
    result = cli("submit", str(input_file), "--endpoint", "/v2/infer", "--wait", "-o", str(tmp_path))
    assert result.exit_code == 3
    assert "cancelled" in result.stderr and "finished lines are downloaded" in result.stderr
    assert (tmp_path / "batch_1_output.jsonl").read_bytes() == OUTPUT


def test_ctrl_c_while_waiting_leaves_the_batch_running_and_says_how_to_cancel(cli, fake_api, input_file, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("batchctl.outcome.batch_wait", interrupted)
    _script_submit(fake_api)
    result = cli("submit", str(input_file), "--endpoint", "/v2/infer", "--wait")
    assert result.exit_code == 130
    assert "batch_1 keeps running" in result.stderr and "batchctl cancel batch_1" in result.stderr
    assert fake_api.requests("POST", "/batches/batch_1/cancel") == []


def test_models_table(cli, fake_api):
    models = [
        {
            "id": "all-MiniLM-L6-v2",
            "object": "model",
            "created": 1,
            "owned_by": "system",
            "kind": "embeddings",
            "endpoint": "/v1/embeddings",
            "max_batch_size": 64,
            "embedding_dimensions": 384,
        },
        {
            "id": "identity",
            "object": "model",
            "created": 1,
            "owned_by": "system",
            "kind": "tensor",
            "endpoint": "/v2/infer",
            "max_batch_size": 8,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "dims": [4]}],
        },
    ]
    fake_api.on("GET", "/models", Reply(body={"object": "list", "data": models}))
    result = cli("models")
    assert result.exit_code == 0, result.output
    assert "384-dim vectors" in result.stdout and "INPUT0 FP32[4]" in result.stdout and "/v2/infer" in result.stdout


def test_usage_without_a_usage_api_on_the_server_exits_2_and_shows_no_figures(cli, fake_api):
    result = cli("usage")
    assert result.exit_code == 2
    assert f"has no usage API yet: GET {fake_api.base_url}/organization/usage/embeddings answered 404" in result.stderr
    assert result.stdout == ""


def test_usage_maps_options_to_query_parameters_and_tabulates_buckets(cli, fake_api):
    buckets = [
        {
            "object": "bucket",
            "start_time": 1764460800,
            "end_time": 1764547200,
            "results": [
                {
                    "object": "organization.usage.embeddings.result",
                    "input_tokens": 12345,
                    "num_model_requests": 40,
                    "model": "all-MiniLM-L6-v2",
                    "api_key_id": None,
                    "project_id": None,
                    "user_id": None,
                },
            ],
        },
        {"object": "bucket", "start_time": 1764547200, "end_time": 1764633600, "results": []},
    ]
    fake_api.on(
        "GET",
        "/organization/usage/embeddings",
        Reply(body={"object": "page", "data": buckets[:1], "has_more": True, "next_page": "p2"}),
        Reply(body={"object": "page", "data": buckets[1:], "has_more": False, "next_page": None}),
    )
    result = cli(
        "usage",
        "--start",
        "1764460800",
        "--end",
        "2025-12-02",
        "--bucket-width",
        "1d",
        "--group-by",
        "model",
        "--limit",
        "1",
    )
    assert result.exit_code == 0, result.output
    first, second = fake_api.requests("GET", "/organization/usage/embeddings")
    assert first.query["start_time"] == ["1764460800"] and first.query["end_time"] == ["1764633600"]
    assert first.query["bucket_width"] == ["1d"] and first.query["limit"] == ["1"]
    assert first.query["group_by[]"] == ["model"]
    assert second.query["page"] == ["p2"]
    assert "all-MiniLM-L6-v2" in result.stdout and "12,345" in result.stdout and "API_KEY_ID" not in result.stdout


def test_an_unreachable_server_is_one_line_not_a_traceback(monkeypatch):
    from typer.testing import CliRunner

    from batchctl.main import app

    # Port 9 (discard) on localhost: nothing listens there, the connection is refused at once.
    result = CliRunner().invoke(app, ["--api-key", "k", "--base-url", "http://127.0.0.1:9/v1", "status", "batch_1"])
    assert result.exit_code == 1
    assert "cannot reach" in result.stderr and "Traceback" not in result.output
