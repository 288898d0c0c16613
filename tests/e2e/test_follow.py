"""`batchctl follow` against a running batch on the real stack: killed and restarted, and behind a proxy that
cuts its connections mid-response, it ends with files equal (as sets of lines) to the batch's final output and
error files, without one duplicate."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_batchctl import BATCHCTL, _env, batchctl
from tests.support.stack import as_file, tensor_lines

pytestmark = pytest.mark.e2e


def _lines_with_refused(n: int, prefix: str) -> list[dict]:
    """n identity lines; every 50th has a tensor of the wrong shape, answered in the error file."""
    lines = tensor_lines(n, prefix=prefix)
    for line in lines[::50]:
        line["body"]["inputs"][0]["shape"] = [1, 3]
    return lines


def _submit(client, lines: list[dict]) -> str:
    uploaded = client.files.create(file=as_file(lines), purpose="batch")
    return client.batches.create(input_file_id=uploaded.id, endpoint="/v2/infer", completion_window="24h").id


def _saved_cursor(path: Path) -> int:
    cursor = path.with_name(path.name + ".cursor")
    return json.loads(cursor.read_text())["cursor"] if cursor.exists() else 0


def _assert_same_lines_once(got: Path, client, file_id: str | None) -> int:
    final = client.files.content(file_id).content.splitlines() if file_id else []
    mine = got.read_bytes().splitlines()
    assert len(mine) == len(set(mine)), f"{got} holds a line twice"
    assert set(mine) == set(final), f"{got} differs from the final file ({len(mine)} vs {len(final)} lines)"
    return len(mine)


def test_follow_killed_and_restarted_ends_with_the_final_files_once(e2e, tmp_path):
    name = "follow-killed"
    key = e2e.new_tenant(name)
    client = e2e.sdk(key)
    lines = _lines_with_refused(800, "fk")  # 50 shards of 16 (the e2e stack's SHARD_MAX_LINES)
    batch_id = _submit(client, lines)
    deadline = time.monotonic() + 600  # a loaded host validates slowly
    first_done = "SELECT id FROM batches_shard WHERE batch_id=%s AND status='succeeded' LIMIT 1"
    while not e2e.sql(first_done, batch_id):
        assert time.monotonic() < deadline, "no shard of the batch finished"
        time.sleep(0.1)
    # Hold the rest of the batch once a shard has finished (a paused tenant's pending shards wait), so the
    # follower starts and is killed on a running batch: paused only after the follower's first save, the
    # whole batch had finished at load 27 (the follower's own start took that long).
    e2e.tenant_update(name, "paused=true")
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    args = [str(BATCHCTL), "follow", batch_id, "-o", str(out), "-e", str(err), "--poll-interval", "0.2"]
    first = subprocess.Popen(args, env=_env(e2e, key), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while _saved_cursor(out) == 0:
            assert first.poll() is None and time.monotonic() < deadline, "follow saved nothing"
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        first.kill()
    assert client.batches.retrieve(batch_id).status == "in_progress"
    kept = _saved_cursor(out)
    assert 0 < kept < 800 - 16

    e2e.tenant_update(name, "paused=false")
    second = batchctl(e2e, "follow", batch_id, "-o", str(out), "-e", str(err), "--poll-interval", "0.2", api_key=key)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "lines saved" in second.stdout and "completed" in second.stdout
    batch = client.batches.retrieve(batch_id)
    assert batch.status == "completed"
    assert _assert_same_lines_once(out, client, batch.output_file_id) == 800 - 16
    assert _assert_same_lines_once(err, client, batch.error_file_id) == 16
    # Followed to the end, the output file is the final one byte for byte (the stream is its prefix).
    assert out.read_bytes() == client.files.content(batch.output_file_id).content

    again = batchctl(e2e, "follow", batch_id, "-o", str(out), "-e", str(err), api_key=key)
    assert again.returncode == 0 and _assert_same_lines_once(out, client, batch.output_file_id) == 800 - 16
    other = batchctl(e2e, "follow", "batch_other", "-o", str(out), api_key=key)
    assert other.returncode == 1 and f"holds the output lines of {batch_id}" in other.stderr


@contextlib.contextmanager
def _cutting_proxy(upstream_port: int, cut_after_bytes: int) -> Iterator[tuple[int, list[int]]]:
    """A TCP proxy that closes every connection once it has sent ``cut_after_bytes`` downstream: responses
    are cut mid-body, as a flaky network or a restarting load balancer does. Yields (port, cuts)."""
    listener = socket.create_server(("127.0.0.1", 0))
    cuts: list[int] = []
    stop = threading.Event()

    def pipe(source: socket.socket, sink: socket.socket, budget: int | None) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while data := source.recv(16384):
                if budget is not None and sent + len(data) >= budget:
                    sink.sendall(data[: budget - sent])
                    cuts.append(budget)
                    break
                sink.sendall(data)
                sent += len(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
                end.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                downstream, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", upstream_port))
            threading.Thread(target=pipe, args=(downstream, upstream, None), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, downstream, cut_after_bytes), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], cuts
    finally:
        stop.set()
        listener.close()


def test_follow_through_connections_cut_mid_response_keeps_every_line_once(e2e, tmp_path):
    key = e2e.new_tenant("follow-cut")
    client = e2e.sdk(key)
    lines = _lines_with_refused(480, "fc")
    batch_id = _submit(client, lines)
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    web_port = int(e2e.base_url.rsplit(":", 1)[1].split("/")[0])
    with _cutting_proxy(web_port, cut_after_bytes=20_000) as (port, cuts):
        done = batchctl(
            e2e,
            "follow",
            batch_id,
            "-o",
            str(out),
            "-e",
            str(err),
            "--poll-interval",
            "0.2",
            api_key=key,
            BATCHCTL_BASE_URL=f"http://127.0.0.1:{port}/v1",
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert cuts, "the proxy never cut a connection: the test proved nothing"
    assert "connection lost" in done.stdout
    batch = client.batches.retrieve(batch_id)
    assert _assert_same_lines_once(out, client, batch.output_file_id) == 480 - 10
    assert _assert_same_lines_once(err, client, batch.error_file_id) == 10
