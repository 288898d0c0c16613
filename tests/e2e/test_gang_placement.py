"""A tensor-parallel generation model placed as a gang on real tritonservers.

build_engines maps a model's ``tensor_parallel_size`` k to the catalogue's ``gpus_per_instance`` k
(emit_generation.py). Here tinylm is declared a 2-way tensor-parallel model of 300 MiB per GPU, on a fleet
of two servers with two declared 512 MiB GPUs each, one of whose GPUs already holds 300 MiB of something
else: the only place for the gang is both GPUs of the other server. A chat batch must complete with 0 failed
lines, and the placement, its load event and the model Triton serves must be that one gang instance. On
declared GPUs the instance runs as KIND_CPU (fleet/placement/reconciler.py); on a GPU host the same placement becomes
``instance_group { kind: KIND_GPU, gpus: [0, 1] }``."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg
import pytest

from deploy.local.fleet import local_fleet
from tests.e2e.test_placement import BROKER_URL
from tests.support.stack import assert_exactly_once, submit

pytestmark = pytest.mark.e2e

MIB = 1024**2
SETUP = f"""
from controlplane.fleet.models import CatalogueModel, Gpu
Gpu.objects.filter(server__name="triton0", index=1).update(used_by_others_bytes={300 * MIB})
CatalogueModel.objects.filter(triton_name="tinylm").update(
    gpus_per_instance=2, memory_per_instance_bytes={300 * MIB}, max_instances=1, load_seconds=10.0)
"""


def chat_lines(n: int) -> list[dict]:
    return [
        {
            "custom_id": f"tp-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tinylm",
                "messages": [{"role": "user", "content": f"count from {i % 10} to {i % 10 + 4}"}],
                "max_tokens": 16,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]


def _ready(http_url: str, model: str) -> bool:
    """Triton's own answer (HTTP /v2/models/{model}/ready), not the control plane's record."""
    try:
        with urllib.request.urlopen(f"{http_url}/v2/models/{model}/ready", timeout=10) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


def _rows(db_url: str, query: str) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(query).fetchall()


def test_a_tensor_parallel_model_is_placed_as_a_gang_on_one_server_and_serves_its_batch(tmp_path: Path):
    from openai import OpenAI

    env = {
        "SHARD_MAX_LINES": "16",
        "FLEET_RECONCILE_INTERVAL_SECONDS": "2",
        "FLEET_HEARTBEAT_INTERVAL_SECONDS": "2",
    }
    with local_fleet(
        tmp_path, servers=2, gpu_bytes=512 * MIB, gpus_per_server=2, env=env, broker_url=BROKER_URL
    ) as fleet:
        fleet.stack.manage("shell", "-c", SETUP)
        client = OpenAI(base_url=f"{fleet.stack.base_url}/v1", api_key=fleet.api_key, max_retries=0, timeout=60)
        lines = chat_lines(40)
        batch = submit(client, lines, endpoint="/v1/chat/completions")
        deadline = time.monotonic() + 300
        while batch.status not in ("completed", "failed", "cancelled", "expired") and time.monotonic() < deadline:
            time.sleep(0.5)
            batch = client.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.request_counts.failed == 0, (batch.status, batch.request_counts)
        output, _ = assert_exactly_once(client, batch, lines)
        for record in output:
            body = record["response"]["body"]
            assert record["response"]["status_code"] == 200 and body["object"] == "chat.completion", record
        placements = _rows(
            fleet.db_url,
            "SELECT s.name, p.gpus, p.instances, p.status FROM fleet_placement p "
            "JOIN fleet_tritonserver s ON s.id=p.server_id JOIN fleet_cataloguemodel m ON m.id=p.model_id "
            "WHERE m.triton_name='tinylm'",
        )
        loads = _rows(
            fleet.db_url,
            "SELECT s.name, e.ok FROM fleet_placementevent e JOIN fleet_tritonserver s ON s.id=e.server_id "
            "JOIN fleet_cataloguemodel m ON m.id=e.model_id WHERE m.triton_name='tinylm' AND e.action='load'",
        )
        served = [_ready(h.http_url, "tinylm") for h in fleet.servers]
    # One gang instance over both GPUs of triton1: triton0 has 300 MiB on one GPU only, never both free.
    assert placements == [("triton1", "0,1", 1, "ready")], placements
    assert loads and all(name == "triton1" and ok for name, ok in loads), loads
    assert served == [False, True], served
