"""A batch whose lines name tinylm and its two LoRA adapters (`tinylm:double`, `tinylm:reverse`) through the
production shard path against tinylm on a real tritonserver: one stream, one continuous batch, each line
answered in its adapter's own way (the adapters' trained grammar is the oracle), the output bodies naming the
model each line asked for, and the ledger and the tenant's usage report split per adapter; and the engine's
lora_control request loading and unloading adapters on the running server."""

from __future__ import annotations

import json
import queue
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from django.utils import timezone
from openai.types.chat import ChatCompletion

from controlplane.batches.models import BatchStatus
from controlplane.triton.client import TritonClient
from controlplane.usage.models import UsageRecord
from tests.kinds.test_generation_batch import CHAT, run_batch
from tests.support.triton_fixture import (  # fixtures and the log-tail hook
    pytest_runtest_makereport,
    triton_client,
    triton_model_repository,
    triton_server,
)

pytestmark = pytest.mark.django_db

ANSWERS = {
    "tinylm": lambda a, b: " ".join(str(n) for n in range(a, b + 1)),
    "tinylm:double": lambda a, b: " ".join(f"{n} {n}" for n in range(a, b + 1)),
    "tinylm:reverse": lambda a, b: " ".join(str(n) for n in range(b, a - 1, -1)),
}


@pytest.fixture
def adapters_dir():
    return Path(__file__).resolve().parents[2] / "triton_models" / "tinylm" / "1" / "adapters"


@pytest.fixture(scope="module")
def tinylm(triton_client: TritonClient) -> Iterator[TritonClient]:
    triton_client.ensure_loaded("tinylm")
    yield triton_client


def line(custom_id: str, model: str, a: int, b: int) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": f"count from {a} to {b}"}]}
    body |= {"temperature": 0, "max_tokens": 30}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def test_base_and_adapter_lines_of_one_batch_each_get_their_own_answer_and_usage(
    tenant, api, tinylm, triton_server, settings, monkeypatch
):
    pairs = [(1, 4), (3, 5), (2, 6), (0, 3), (5, 8), (4, 6)]
    lines = [line(f"{model}-{a}-{b}", model, a, b) for a, b in pairs for model in ANSWERS]
    lines.append(line("unknown-adapter", "tinylm:nope", 1, 2))
    batch, output, errors = run_batch(tenant, lines, CHAT, triton_server, tinylm, settings, monkeypatch)
    assert batch.status == BatchStatus.COMPLETED, batch.errors
    assert batch.model == "tinylm" and (batch.completed_lines, batch.failed_lines) == (len(lines) - 1, 1)

    error = errors["unknown-adapter"]["response"]
    assert error["status_code"] == 400 and error["body"]["error"]["param"] == "body.model"
    assert "its adapters: tinylm:double, tinylm:reverse" in error["body"]["error"]["message"]

    tokens: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (a, b), model in [(pair, model) for pair in pairs for model in ANSWERS]:
        completion = ChatCompletion.model_validate(output[f"{model}-{a}-{b}"]["response"]["body"])
        assert completion.model == model  # the body names what the line asked for
        assert completion.choices[0].message.content == ANSWERS[model](a, b), (model, a, b)
        tokens[model][0] += completion.usage.prompt_tokens
        tokens[model][1] += completion.usage.completion_tokens

    # The ledger: a row per model name the lines used, each with its own lines' tokens.
    ledger: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for record in UsageRecord.objects.filter(batch_id=batch.id):
        ledger[record.model][0] += record.tokens
        ledger[record.model][1] += record.output_tokens
        ledger[record.model][2] += record.completed_lines
        assert record.triton_model == "tinylm"
    assert {model: row[:2] for model, row in ledger.items()} == dict(tokens)
    assert {model: row[2] for model, row in ledger.items()} == dict.fromkeys(ANSWERS, len(pairs))

    # The tenant's report, grouped by model, shows the adapters apart.
    start = int(timezone.now().timestamp()) - 3600
    page = api.get("/v1/organization/usage/completions", {"start_time": start, "group_by": "model"}).json()
    by_model = {r["model"]: r for bucket in page["data"] for r in bucket["results"]}
    assert {model: [r["input_tokens"], r["output_tokens"]] for model, r in by_model.items()} == dict(tokens)


def _control(grpc_url: str, command: dict) -> dict:
    """One lora_control request to tinylm on the server (decoupled: over a stream), its JSON answer."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        control = grpcclient.InferInput("lora_control", [1], "BYTES")
        control.set_data_from_numpy(np.array([json.dumps(command).encode()], dtype=np.object_))
        client.async_stream_infer("tinylm", [control], enable_empty_final_response=True)
        result, error = answers.get(timeout=60)
        if error is not None:
            raise RuntimeError(str(error))
        return json.loads(result.as_numpy("text_output")[0])
    finally:
        client.stop_stream()
        client.close()


def test_a_control_request_loads_and_unloads_adapters_while_the_base_serves(tinylm, triton_server, adapters_dir):
    url = triton_server.grpc_url
    before = set(_control(url, {"action": "list"})["adapters"])
    assert {"double", "reverse"} <= before  # LORA_ADAPTERS empty: every adapter of ADAPTERS_DIR at start
    assert "backwards" not in _control(url, {"action": "unload", "name": "reverse"})["adapters"]
    loaded = _control(url, {"action": "load", "name": "backwards", "path": str(adapters_dir / "reverse")})["adapters"]
    assert "backwards" in loaded and "reverse" not in loaded
    with pytest.raises(RuntimeError, match="is not loaded"):
        _control(url, {"action": "unload", "name": "nope"})
    assert "reverse" in _control(url, {"action": "load", "name": "reverse"})["adapters"]  # from ADAPTERS_DIR
    assert "backwards" not in _control(url, {"action": "unload", "name": "backwards"})["adapters"]
