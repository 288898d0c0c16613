"""What `batchctl follow` asks the API per poll (batchctl/follow.py), against the scripted fake API: the Batch
object only now and then and when a stream reports a new status, the error stream only when the batch says
it may hold lines, and a cursor file rewritten only when its lines moved."""

from __future__ import annotations

import json

from batchctl.follow import sink_open
from tests.cli.fake_api import FakeAPI, Reply, batch_json, error_json

OUT = [b'{"custom_id": "a"}\n', b'{"custom_id": "b"}\n', b'{"custom_id": "c"}\n']
ERR = b'{"custom_id": "x", "error": {"code": "bad"}}\n'


def _lines(body: bytes, cursor: int, status: str, complete: bool = False) -> Reply:
    headers = {"X-Next-Cursor": str(cursor), "X-Results-Complete": str(complete).lower(), "X-Batch-Status": status}
    return Reply(body=body, headers={"Content-Type": "application/jsonl", **headers})


def _follow(cli, tmp_path):
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    result = cli("follow", "batch_1", "-o", str(out), "-e", str(err), "--poll-interval", "0.1")
    return result, out, err


def test_a_batch_without_failures_is_read_once_and_its_error_stream_asked_only_at_its_end(cli, fake_api, tmp_path):
    done = dict(output_file_id="file-out")
    fake_api.on(
        "GET",
        "/batches/batch_1",
        Reply(body=batch_json(status="in_progress", total=3)),
        Reply(body=batch_json(status="completed", done=3, total=3, **done)),
    )
    fake_api.on(
        "GET",
        "/batches/batch_1/output",
        _lines(OUT[0], 1, "in_progress"),
        _lines(b"", 1, "in_progress"),
        _lines(OUT[1], 2, "in_progress"),
        _lines(OUT[2], 3, "completed", complete=True),
    )
    fake_api.on("GET", "/batches/batch_1/errors", _lines(b"", 0, "completed", complete=True))
    result, out, err = _follow(cli, tmp_path)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == b"".join(OUT) and err.read_bytes() == b""
    assert [int(seen.query["after"][0]) for seen in fake_api.requests("GET", "/batches/batch_1/output")] == [0, 1, 1, 2]
    # Read at the start, then again when the output stream said "completed": not once per poll.
    assert len(fake_api.requests("GET", "/batches/batch_1")) == 2
    # Asked once, after the batch had ended: while it ran with no failure the stream could hold no line.
    [errors] = fake_api.requests("GET", "/batches/batch_1/errors")
    assert errors.query["after"] == ["0"]
    assert "completed" in result.stdout


def test_the_error_stream_is_asked_while_the_batch_has_failures_it_lacks(cli, fake_api, tmp_path):
    fake_api.on(
        "GET",
        "/batches/batch_1",
        Reply(body=batch_json(status="in_progress", done=1, failed=1, total=2)),
        Reply(body=batch_json(status="completed", done=1, failed=1, total=2, output_file_id="o", error_file_id="e")),
    )
    fake_api.on(
        "GET",
        "/batches/batch_1/output",
        _lines(OUT[0], 1, "in_progress"),
        _lines(b"", 1, "completed", complete=True),
    )
    fake_api.on(
        "GET", "/batches/batch_1/errors", _lines(ERR, 1, "in_progress"), _lines(b"", 1, "completed", complete=True)
    )
    result, out, err = _follow(cli, tmp_path)
    assert result.exit_code == 0, result.output
    assert (out.read_bytes(), err.read_bytes()) == (OUT[0], ERR)
    assert [seen.query["after"] for seen in fake_api.requests("GET", "/batches/batch_1/errors")] == [["0"], ["1"]]


def test_an_ended_stream_redirected_to_storage_is_saved_without_sending_the_api_key(cli, fake_api, tmp_path):
    """On S3 the API answers an ended batch's stream from the start with a 302 to a presigned URL, carrying the
    cursor headers itself; the bytes come from storage, another origin, which must never see the API key."""
    with FakeAPI() as storage:
        storage.on("GET", "/bucket/out.jsonl", Reply(body=b"".join(OUT), headers={"Content-Type": "application/jsonl"}))
        cursor = {"X-Next-Cursor": "3", "X-Results-Complete": "true", "X-Batch-Status": "completed"}
        location = storage.base_url + "/bucket/out.jsonl?X-Amz-Signature=signed"
        done = batch_json(status="completed", done=3, total=3, output_file_id="file-out")
        fake_api.on("GET", "/batches/batch_1", Reply(body=done))
        fake_api.on("GET", "/batches/batch_1/output", Reply(302, b"", headers={"Location": location, **cursor}))
        fake_api.on("GET", "/batches/batch_1/errors", _lines(b"", 0, "completed", complete=True))
        result, out, _ = _follow(cli, tmp_path)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == b"".join(OUT)
    saved = json.loads(out.with_name(out.name + ".cursor").read_text())
    assert (saved["cursor"], saved["bytes"]) == (3, len(b"".join(OUT)))
    # Complete after one answer: the stream was asked once.
    [asked] = fake_api.requests("GET", "/batches/batch_1/output")
    assert asked.headers["authorization"] == "Bearer sk-test"
    [fetched] = storage.requests("GET", "/bucket/out.jsonl")
    assert fetched.query == {"X-Amz-Signature": ["signed"]}
    assert "authorization" not in fetched.headers


def test_a_cursor_file_is_rewritten_only_when_its_lines_moved(tmp_path):
    sink = sink_open(tmp_path / "out.jsonl", batch_id="batch_1", stream="output")
    cursor_file = sink.cursor_path
    first = cursor_file.stat().st_ino  # each save replaces the file: a new inode
    sink.save()
    assert cursor_file.stat().st_ino == first
    sink.append(OUT[0])
    sink.save()
    assert cursor_file.stat().st_ino != first
    assert json.loads(cursor_file.read_text()) == {"batch_id": "batch_1", "stream": "output", "cursor": 1, "bytes": 19}
    sink.close()


def test_following_never_imports_the_openai_sdk(fake_api, tmp_path):
    """A follow often runs on the host of the batch it follows; the SDK's import alone is ~0.5–0.7 s of CPU it
    would take from that batch (docs/performance.md). The other commands still use the SDK."""
    import subprocess
    import sys

    fake_api.on("GET", "/batches/batch_1", Reply(body=batch_json(status="completed", done=1, total=1)))
    fake_api.on("GET", "/batches/batch_1/output", _lines(OUT[0], 1, "completed", complete=True))
    fake_api.on("GET", "/batches/batch_1/errors", _lines(b"", 0, "completed", complete=True))
    script = (
        "import sys; from batchctl.main import app; "
        "app(['--api-key', 'k', '--base-url', sys.argv[1], 'follow', 'batch_1', '-o', sys.argv[2]], "
        "standalone_mode=False); print('openai imported:', 'openai' in sys.modules)"
    )
    out = tmp_path / "out.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", script, fake_api.base_url, str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == OUT[0]
    assert done.stdout.strip().endswith("openai imported: False"), done.stdout


def test_a_refused_follow_prints_the_servers_message_and_exits_1(cli, fake_api, tmp_path):
    fake_api.on("GET", "/batches/batch_1", Reply(404, error_json("No batch batch_1 for this key.", "not_found")))
    result, out, _ = _follow(cli, tmp_path)
    assert result.exit_code == 1
    assert "No batch batch_1 for this key. (HTTP 404, code not_found)" in result.stderr
    assert out.read_bytes() == b""
