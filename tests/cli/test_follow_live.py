"""`batchctl follow` as a real process against the real API (Django's live server on the test Postgres), the
batch's shards run in the test the way slots run them (the unit tests' fake backend): killed mid-batch and
restarted, and through a proxy that cuts its connections mid-response, its files end equal to the batch's
final files with no line twice. tests/e2e/test_follow.py does the same on the whole stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from tests.batches.test_dead_letters import sent
from tests.batches.test_lifecycle import _create
from tests.e2e.test_follow import _cutting_proxy
from tests.support.batches import embedding_line
from tests.support.fakes import FakeBackend
from tests.support.running import run_next

pytestmark = pytest.mark.django_db(transaction=True)

BATCHCTL = Path(sys.executable).parent / "batchctl"
LINES = [embedding_line(f"r{i:02d}", f"text {i}" + (" REJECT" if i % 7 == 3 else "")) for i in range(48)]


@pytest.fixture
def batch(tenant, sent, settings) -> Batch:
    settings.SHARD_MAX_LINES = 4  # 12 shards
    batch = _create(tenant, LINES)
    services.batch_validate(batch_id=batch.id)
    return Batch.objects.get(id=batch.id)


def _follow(base_url: str, key: str, batch_id: str, out: Path, err: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TTY_", "FORCE_COLOR"))}
    env.update(BATCHCTL_API_KEY=key, BATCHCTL_BASE_URL=base_url, COLUMNS="160")
    command = [str(BATCHCTL), "follow", batch_id, "-o", str(out), "-e", str(err), "--poll-interval", "0.2"]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _cursor(path: Path) -> int:
    state = path.with_name(path.name + ".cursor")
    return json.loads(state.read_text())["cursor"] if state.exists() else 0


def _run_shards(batch: Batch, count: int) -> None:
    for _ in range(count):
        cycle = run_next(batch.model, FakeBackend())
        assert cycle is not None and cycle.outcome == "succeeded"


def _final(file_id: str | None) -> bytes:
    if file_id is None:
        return b""
    with blob_open(File.objects.get(id=file_id).storage_name) as fh:
        return fh.read()


def _wait(predicate, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _assert_final(batch: Batch, out: Path, err: Path) -> None:
    batch.refresh_from_db()
    assert batch.status == BatchStatus.COMPLETED
    for path, file_id in ((out, batch.output_file_id), (err, batch.error_file_id)):
        mine = path.read_bytes().splitlines()
        assert len(mine) == len(set(mine)), f"{path} holds a line twice"
        assert path.read_bytes() == _final(file_id), f"{path} differs from the final file"


def test_killed_and_restarted_follow_ends_with_the_final_files(live_server, tenant, batch, tmp_path):
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    base_url = f"{live_server.url}/v1"
    _run_shards(batch, 3)
    first = _follow(base_url, tenant.raw_key, batch.id, out, err)
    try:
        _wait(lambda: _cursor(out) > 0, "follow saved nothing")
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        first.kill()
    assert Batch.objects.get(id=batch.id).status == BatchStatus.IN_PROGRESS
    assert 0 < _cursor(out) < 48
    with out.open("ab") as torn:  # a line half written when the process died: cut back to the cursor
        torn.write(b'{"id": "batch_req_torn", "cust')

    second = _follow(base_url, tenant.raw_key, batch.id, out, err)
    try:
        _run_shards(batch, 4)
        _wait(lambda: _cursor(out) > 20, "the restarted follow saved nothing new")
        _run_shards(batch, 5)  # the last one finalizes
        output, _ = second.communicate(timeout=120)
    finally:
        second.kill()
    assert second.returncode == 0, output
    assert "lines saved" in output and "completed" in output
    _assert_final(batch, out, err)


def test_follow_through_connections_cut_mid_response(live_server, tenant, batch, tmp_path):
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    port = int(live_server.url.rsplit(":", 1)[1])
    with _cutting_proxy(port, cut_after_bytes=20_000) as (proxy_port, cuts):
        follower = _follow(f"http://127.0.0.1:{proxy_port}/v1", tenant.raw_key, batch.id, out, err)
        try:
            _run_shards(batch, 6)
            _wait(lambda: _cursor(out) > 0, "follow saved nothing")
            _run_shards(batch, 6)
            output, _ = follower.communicate(timeout=180)
        finally:
            follower.kill()
    assert follower.returncode == 0, output
    assert cuts, "the proxy never cut a connection: the test proved nothing"
    assert "connection lost" in output
    _assert_final(batch, out, err)
