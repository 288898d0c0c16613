"""Helpers of the tests against a running stack (tests/e2e, tests/chaos): input lines, a submit, waits on its
shards, its results read back and checked exactly once, a sleeping model registered on the stack."""

from __future__ import annotations

import io
import json
import random
import time

WORDS = [
    "batch",
    "shard",
    "worker",
    "triton",
    "model",
    "tenant",
    "embedding",
    "request",
    "output",
    "error",
    "lease",
    "attempt",
    "queue",
    "placement",
    "fleet",
    "latency",
    "throughput",
    "cancel",
    "expire",
    "finalize",
    "validate",
]


def embedding_lines(n: int, *, seed: int = 0, prefix: str = "req") -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "custom_id": f"{prefix}-{i:05d}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "all-MiniLM-L6-v2", "input": " ".join(rng.choices(WORDS, k=rng.randint(3, 40)))},
        }
        for i in range(n)
    ]


def tensor_lines(n: int, *, prefix: str = "t", model: str = "identity", rows: int = 1) -> list[dict]:
    """n `/v2/infer` lines, each one FP32 tensor of shape [rows, 4] (rows = the line's work units)."""
    return [
        {
            "custom_id": f"{prefix}-{i:05d}",
            "method": "POST",
            "url": "/v2/infer",
            "body": {
                "model": model,
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [rows, 4], "data": [float(i), 1.0, 2.0, 3.0] * rows}
                ],
            },
        }
        for i in range(n)
    ]


def as_file(lines: list[dict], name: str = "input.jsonl") -> tuple[str, io.BytesIO]:
    return name, io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


def submit(
    client,
    lines: list[dict],
    *,
    endpoint: str = "/v1/embeddings",
    window: str = "24h",
    metadata=None,
    priority: str | None = None,
):
    """Upload the lines and create a batch; ``priority`` goes as the extra body field the service reads."""
    uploaded = client.files.create(file=as_file(lines), purpose="batch")
    extra = {"priority": priority} if priority else None
    return client.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint, completion_window=window, metadata=metadata, extra_body=extra
    )


def shard_counts(e2e, batch_id: str) -> dict[str, int]:
    rows = e2e.sql("SELECT status, count(*) FROM batches_shard WHERE batch_id=%s GROUP BY status", batch_id)
    return {status: n for status, n in rows}


def wait_for_running_shard(e2e, batch_id: str, timeout_s: float = 60, *, open_will_do: bool = False) -> None:
    """Until a shard has succeeded and another is running (or, with ``open_will_do``, is still open: pending or
    running). On a timeout the message has the shards by status and the batch's status."""
    deadline, counts = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        counts = shard_counts(e2e, batch_id)
        left = counts.get("running", 0) + (counts.get("pending", 0) if open_will_do else 0)
        if counts.get("succeeded", 0) >= 1 and left >= 1:
            return
        time.sleep(0.02)
    status = e2e.sql("SELECT status FROM batches_batch WHERE id=%s", batch_id)[0][0]
    raise AssertionError(f"no shard was running beside a finished one: shards {counts}, batch {status}")


def read_jsonl(client, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def assert_exactly_once(client, batch, lines: list[dict]) -> tuple[list[dict], list[dict]]:
    """Every input custom_id appears exactly once across output and error files, in input order."""
    output, errors = read_jsonl(client, batch.output_file_id), read_jsonl(client, batch.error_file_id)
    seen = [r["custom_id"] for r in output] + [r["custom_id"] for r in errors]
    expected = [line["custom_id"] for line in lines]
    assert len(seen) == len(set(seen)), "a custom_id appears twice"
    assert sorted(seen) == sorted(expected), "a custom_id is missing or unknown"
    order = {cid: i for i, cid in enumerate(expected)}
    for records in (output, errors):
        positions = [order[r["custom_id"]] for r in records]
        assert positions == sorted(positions), "results are not in input order"
    assert batch.request_counts.completed == len(output)
    assert batch.request_counts.failed == len(errors)
    return output, errors


# A catalogue entry for a sleeping model (triton_models/sleep_per_row*), its interface taken from config.pbtxt.
# Throughput is declared until measured: a dispatch slot's seconds per row, with the slots sharing one instance.
_REGISTER_SLEEPING = """
from controlplane.fleet.models import CatalogueModel
from controlplane.triton.client import repository_model_config
from django.conf import settings
c = repository_model_config(settings.TRITON_MODEL_REPOSITORY, "{triton}")
t = lambda es: [{{"name": e["name"], "datatype": e["data_type"].removeprefix("TYPE_"), "dims": [int(d) for d in e["dims"]]}} for e in es]
s = float(c["parameters"]["seconds_per_row"]["string_value"])
CatalogueModel.objects.update_or_create(name="{name}", defaults=dict(
    triton_name="{triton}", kind="tensor", max_batch_size=int(c["max_batch_size"]), inputs=t(c["input"]),
    outputs=t(c["output"]), memory_per_instance_bytes={memory}, load_seconds=2.0, max_instances={max_instances},
    seconds_per_work_unit=s * settings.SCHEDULER_CALLS_PER_INSTANCE / settings.DISPATCH_INFLIGHT_CALLS))
"""


def register_sleeping_model(stack, *, name: str, triton: str, memory_bytes: int, max_instances: int) -> None:
    """Register a sleeping model in the stack's catalogue (the scenarios that need demand without CPU)."""
    code = _REGISTER_SLEEPING.format(name=name, triton=triton, memory=memory_bytes, max_instances=max_instances)
    stack.manage("shell", "-c", code)
