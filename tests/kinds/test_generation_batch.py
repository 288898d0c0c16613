"""Generation batches through the production shard path (batches/services validate, batches/execution
a slot cycle with the TritonBackend a worker builds) against tinylm on a real tritonserver: the engine's answers
rendered as OpenAI's objects and checked against its published schemas, and the trained grammar asserted
(the count is right, stop at EOS, length at max_tokens, n choices, a seed repeats). The fake engine of
test_generation_kind.py stands in for this one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from controlplane.batches import services
from controlplane.batches.models import Batch, BatchStatus, Shard
from controlplane.batches.run.records import request_id
from controlplane.core.messaging import dispatch
from controlplane.files.models import File
from controlplane.files.storage import blob_open
from controlplane.fleet.backend import TritonBackend
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.generation.kind import model_tokenizer
from controlplane.scheduling.runner import shard_run_next
from controlplane.triton.client import TritonClient
from tests.contracts.openai_schema import validate
from tests.support.batches import jsonl, upload
from tests.support.triton_fixture import (
    pytest_runtest_makereport,
    triton_client,
    triton_model_repository,
    triton_server,
)

pytestmark = pytest.mark.django_db
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


@pytest.fixture(scope="module")
def tinylm(triton_client: TritonClient) -> Iterator[TritonClient]:
    triton_client.ensure_loaded("tinylm")
    yield triton_client


def count(a: int, b: int) -> str:
    return " ".join(str(n) for n in range(a, b + 1))


def chat_line(custom_id: str, content: str, **fields: Any) -> dict[str, Any]:
    body = {"model": "tinylm", "messages": [{"role": "user", "content": content}], **fields}
    return {"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}


def completion_line(custom_id: str, prompt: str, **fields: Any) -> dict[str, Any]:
    body = {"model": "tinylm", "prompt": prompt, **fields}
    return {"custom_id": custom_id, "method": "POST", "url": COMPLETIONS, "body": body}


def run_batch(tenant, lines, endpoint, triton_server, client, settings, monkeypatch, backend_factory=None):
    """Validate and run every shard as a worker does; returns the batch and its output and error records."""
    monkeypatch.setattr(dispatch, "send", lambda task_name, args: None)  # the test runs the shards itself
    settings.SHARD_MAX_LINES = 4  # several shards, each over its own stream
    batch = services.batch_create(
        tenant=tenant, input_file_id=upload(tenant, jsonl(lines)).id, endpoint=endpoint, completion_window="24h"
    )
    services.batch_validate(batch_id=batch.id)
    backend = TritonBackend(client, triton_server.grpc_url)
    factory = backend_factory or (lambda name: backend)
    model = CatalogueModel.objects.get(name=Batch.objects.values_list("model", flat=True).get(id=batch.id))
    for shard in Shard.objects.filter(batch=batch).order_by("index"):
        # One cycle of a slot, as a worker runs it: the policy serves this batch's next shard.
        cycle = shard_run_next(model=model, owner="test", backend_factory=factory)
        assert cycle is not None and (cycle.shard_id, cycle.outcome) == (shard.id, "succeeded")
    batch = Batch.objects.get(id=batch.id)
    return batch, _records(batch.output_file_id), _records(batch.error_file_id)


def _records(file_id: str | None) -> dict[str, dict[str, Any]]:
    if file_id is None:
        return {}
    with blob_open(File.objects.get(id=file_id).storage_name) as fh:
        return {record["custom_id"]: record for record in map(json.loads, fh)}


def test_a_chat_batch_follows_the_grammar_and_openais_schema(tenant, tinylm, triton_server, settings, monkeypatch):
    greedy = {"temperature": 0, "max_tokens": 40}
    sampled = {"temperature": 1.5, "max_tokens": 30, "seed": 1234}
    lines = [
        *(chat_line(f"count-{a}", f"count from {a} to {a + d}", **greedy) for a, d in [(3, 6), (0, 12), (17, 3)]),
        chat_line("length", "count from 10 to 30", temperature=0, max_completion_tokens=5),
        chat_line("bad", "count from 1 to 3", temperature=5),
        chat_line("n", "count from 2 to 7", n=3, temperature=1.0, max_tokens=30),
        chat_line("seed-a", "count from 1 to 20", **sampled),
        chat_line("seed-b", "count from 1 to 20", **sampled),
        chat_line("logprobs", "count from 4 to 6", logprobs=True, top_logprobs=2, **greedy),
        chat_line("stop", "count from 1 to 9", stop=[" 5"], **greedy),
    ]
    batch, output, errors = run_batch(tenant, lines, CHAT, triton_server, tinylm, settings, monkeypatch)
    assert batch.status == BatchStatus.COMPLETED, batch.errors
    assert (batch.completed_lines, batch.failed_lines) == (len(lines) - 1, 1)

    # The refused body is a 400 line naming the field; every other line is a chat completion.
    assert set(errors) == {"bad"} and set(output) == {line["custom_id"] for line in lines} - {"bad"}
    error = errors["bad"]["response"]
    assert error["status_code"] == 400 and error["body"]["error"]["param"] == "body.temperature"
    completions = {}
    for number, line in enumerate(lines, start=1):
        record = output.get(line["custom_id"])
        if record is None:
            continue
        body = record["response"]["body"]
        validate(body, "CreateChatCompletionResponse")
        completions[line["custom_id"]] = completion = ChatCompletion.model_validate(body)
        assert (
            completion.id
            == "chatcmpl-" + request_id(batch.id, number)
            == "chatcmpl-" + record["response"]["request_id"]
        )
        usage = completion.usage
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and usage.prompt_tokens > 0

    for a, d in [(3, 6), (0, 12), (17, 3)]:
        choice = completions[f"count-{a}"].choices[0]
        assert (choice.message.content, choice.finish_reason) == (count(a, a + d), "stop")
        assert completions[f"count-{a}"].usage.completion_tokens == d + 2  # the numbers and the EOS
    length = completions["length"]
    assert (length.choices[0].message.content, length.choices[0].finish_reason) == (count(10, 14), "length")
    assert length.usage.completion_tokens == 5
    n = completions["n"]
    assert [c.index for c in n.choices] == [0, 1, 2]
    assert all(c.finish_reason in ("stop", "length") for c in n.choices)
    assert 3 <= n.usage.completion_tokens <= 3 * 30  # counted once per choice, each within max_tokens
    seeded = [[c.message.content for c in completions[k].choices] for k in ("seed-a", "seed-b")]
    assert seeded[0] == seeded[1]
    logprobs = completions["logprobs"].choices[0].logprobs.content
    assert [entry.token for entry in logprobs[:3]] == ["4", " 5", " 6"]  # each token's text: they add up
    assert len(logprobs) == completions["logprobs"].usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in logprobs)
    assert logprobs[0].top_logprobs[0].token == "4"  # greedy: the sampled token is the best one
    stop = completions["stop"].choices[0]
    assert (stop.message.content, stop.finish_reason) == ("1 2 3 4", "stop")

    # Usage billed is what the engine counted for the completed lines.
    shards = Shard.objects.filter(batch=batch)
    assert sum(s.prompt_tokens for s in shards) == sum(c.usage.prompt_tokens for c in completions.values())
    assert sum(s.completion_tokens for s in shards) == sum(c.usage.completion_tokens for c in completions.values())


def test_a_completions_batch(tenant, tinylm, triton_server, settings, monkeypatch):
    lines = [
        completion_line("a", "count from 6 to 11 :", temperature=0, max_tokens=20),
        completion_line("b", "count from 6 to 30 :", temperature=0),  # the spec's default: 16 tokens
        completion_line("c", "count from 1 to 3 :", temperature=0, max_tokens=300),  # over the 256 context
    ]
    batch, output, errors = run_batch(tenant, lines, COMPLETIONS, triton_server, tinylm, settings, monkeypatch)
    assert batch.status == BatchStatus.COMPLETED and set(errors) == {"c"}
    assert errors["c"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    bodies = {key: record["response"]["body"] for key, record in output.items()}
    for body in bodies.values():
        validate(body, "CreateCompletionResponse")
    a, b = (Completion.model_validate(bodies[key]) for key in ("a", "b"))
    assert (a.choices[0].text, a.choices[0].finish_reason) == (count(6, 11), "stop")
    assert (b.choices[0].text, b.choices[0].finish_reason) == (count(6, 21), "length")
    tokenizer = model_tokenizer(CatalogueModel.objects.get(name="tinylm"))
    prompt_tokens = len(tokenizer.encode("count from 6 to 30 :", add_special_tokens=True))
    assert b.usage.completion_tokens == 16 and b.usage.prompt_tokens == prompt_tokens


def test_a_managed_fleet_streams_to_the_placement(tenant, tinylm, triton_server, settings, monkeypatch):
    # Servers registered: the worker's backend is a FleetBackend, and the stream goes to the ready placement.
    from controlplane.fleet.backend import FleetBackend
    from controlplane.fleet.models import CatalogueModel, Placement, PlacementStatus, TritonServer

    server = TritonServer.objects.create(name="local", grpc_url=triton_server.grpc_url)
    model = CatalogueModel.objects.get(name="tinylm")
    Placement.objects.create(model=model, server=server, gpus="0", instances=1, status=PlacementStatus.READY)
    lines = [chat_line(f"f{a}", f"count from {a} to {a + 2}", temperature=0) for a in range(1, 6)]
    batch, output, errors = run_batch(
        tenant, lines, CHAT, triton_server, tinylm, settings, monkeypatch, backend_factory=FleetBackend
    )
    assert batch.status == BatchStatus.COMPLETED and errors == {}
    for a in range(1, 6):
        assert output[f"f{a}"]["response"]["body"]["choices"][0]["message"]["content"] == count(a, a + 2)
    assert set(Shard.objects.filter(batch=batch).values_list("triton_server", flat=True)) == {"local"}


def test_token_accounting_follows_what_the_engine_counted(tenant, tinylm, triton_server, settings, monkeypatch):
    """Estimate at validation (prompt + w · n · expected completion), correction at settle to what ran
    ((prompt - cached) + w · completion), the model's expected completion measured from settled shards, and the
    counts on the shards, the Batch object's usage, the ledger and the completions usage report."""
    CatalogueModel.objects.filter(name="tinylm").update(completion_weight=2.0, expected_completion_tokens=None)
    # A shared system prompt: later lines of a shard reuse its cached blocks.
    system = {"role": "system", "content": " ".join(["please"] * 40)}  # a word of tinylm's, one token each
    lines = [
        chat_line(f"c{a}", f"count from {a} to {a + 4}", temperature=0, max_tokens=30, n=1 + a % 2) for a in range(1, 9)
    ]
    for line in lines:
        line["body"]["messages"].insert(0, system)
    batch, output, errors = run_batch(tenant, lines, CHAT, triton_server, tinylm, settings, monkeypatch)
    assert batch.status == BatchStatus.COMPLETED and errors == {}
    usages = [ChatCompletion.model_validate(r["response"]["body"]).usage for r in output.values()]
    prompt = sum(u.prompt_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    choices = sum(1 + a % 2 for a in range(1, 9))

    # The estimate assumed every choice runs to max_tokens (nothing measured yet).
    assert batch.work_units == prompt + 2.0 * choices * 30
    # The tenant's share is corrected to what ran.
    from controlplane.scheduling.models import TenantShare

    served = TenantShare.objects.get(tenant=tenant).served_work_units
    per_shard = [
        (s.prompt_tokens - s.cached_tokens) + 2.0 * s.completion_tokens for s in Shard.objects.filter(batch=batch)
    ]
    assert served == pytest.approx(sum(round(x) for x in per_shard))
    assert served == pytest.approx((prompt - cached) + 2.0 * completion, abs=len(per_shard))

    # The shards and the Batch object carry the counts; the ledger bills them.
    from controlplane.batches.render import batch_render
    from controlplane.usage.models import UsageRecord

    rendered = batch_render(batch)
    validate(rendered, "Batch", null_for_unset=True)
    assert rendered["model"] == "tinylm"
    assert rendered["usage"] == {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    records = UsageRecord.objects.filter(batch_id=batch.id)
    assert sum(r.tokens for r in records) == prompt and sum(r.output_tokens for r in records) == completion
    assert sum(r.cached_tokens for r in records) == cached

    # The expected completion is the mean per choice of each settled shard, smoothed in the order they settled.
    means = [s.completion_tokens / s.completion_choices for s in Shard.objects.filter(batch=batch).order_by("index")]
    smoothed = means[0]
    for mean in means[1:]:
        smoothed = 0.3 * mean + 0.7 * smoothed
    expected = CatalogueModel.objects.get(name="tinylm").expected_completion_tokens
    assert expected == pytest.approx(smoothed) and 1 <= expected <= 30
    # A later batch is estimated with it (capped by each line's max_tokens).
    later, _, _ = run_batch(
        tenant,
        [chat_line("x", "count from 1 to 3", max_tokens=30), chat_line("y", "count from 1 to 3", max_tokens=4)],
        CHAT,
        triton_server,
        tinylm,
        settings,
        monkeypatch,
    )
    later_prompt = Batch.objects.get(id=later.id).prompt_tokens
    assert later.work_units == later_prompt + 2.0 * (min(30, round(expected)) + min(4, round(expected)))
