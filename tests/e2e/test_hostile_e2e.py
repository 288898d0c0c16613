"""The hostile-input corpus of tests/batches/intake/test_hostile_input.py through the running service: uploaded
with the openai SDK, validated by a real Celery worker, every case ends in a terminal state within a
bounded time (a failed batch whose error names line 2 and the case's code, or, for the odd-but-valid
cases, a completed batch), and the API keeps answering throughout. Bodies the endpoint kind refuses are no
batch errors (OpenAI's per-line semantics): they go together, one batch per endpoint, which completes with
each of them a 400 line in the error file under its case's code. The generation corpus
(tests/e2e/hostile_generation.py) is one chat-completions batch of tinylm lines: each refused body a 400
line naming its field, the valid lines around them completed."""

from __future__ import annotations

import io
import json
import time

import pytest
import requests
from openai.types.chat import ChatCompletion

from tests.batches.intake.test_hostile_input import BODY_CODES, CASES, DTYPES, TENSOR, _good
from tests.e2e.hostile_generation import CHAT, GENERATION_CASES, MODEL, generation_lines
from tests.support.batches import jsonl
from tests.support.stack import assert_exactly_once, submit

pytestmark = pytest.mark.e2e

TERMINAL = {"completed", "failed", "expired", "cancelled"}
# Odd-but-valid tensor lines and refused bodies on typed-* models name models that no Triton serves; they are
# accepted by validation (tests/batches) and would wait for a placement forever here, so they do not run.
RUNNABLE = {
    name: case
    for name, case in CASES.items()
    if not ((case[2] is None or case[2] in BODY_CODES) and b'"typed-' in case[1])
}
FAILING = {name: case for name, case in RUNNABLE.items() if case[2] not in BODY_CODES}
REFUSED = {name: case for name, case in RUNNABLE.items() if case[2] in BODY_CODES}


def _refused_batch(client, endpoint: str) -> str:
    """Every refused-body case of ``endpoint`` in one batch, each under its case name as custom_id."""
    cases = {name: case for name, case in REFUSED.items() if case[0] == endpoint}
    assert all(b'"custom_id": "bad"' in case[1] for case in cases.values())
    lines = [case[1].replace(b'"custom_id": "bad"', f'"custom_id": "{name}"'.encode()) for name, case in cases.items()]
    content = jsonl([_good(endpoint, "ok-1"), *lines, _good(endpoint, "ok-2")])
    upload = client.files.create(
        file=(f"refused{endpoint.replace('/', '-')}.jsonl", io.BytesIO(content)), purpose="batch"
    )
    return client.batches.create(input_file_id=upload.id, endpoint=endpoint, completion_window="24h").id


_TYPED_MODELS = f"""
from controlplane.fleet.models import CatalogueModel
for datatype in {(*DTYPES, "BYTES")!r}:
    CatalogueModel.objects.get_or_create(
        name=f"typed-{{datatype.lower()}}",
        defaults=dict(
            triton_name=f"typed-{{datatype.lower()}}", kind="tensor", max_batch_size=8,
            inputs=[{{"name": "X", "datatype": datatype, "dims": [-1]}}],
            outputs=[{{"name": "Y", "datatype": datatype, "dims": [-1]}}],
        ),
    )
"""


def test_every_hostile_case_ends_terminal_through_the_worker(e2e):
    e2e.stack.manage("shell", "-c", _TYPED_MODELS)
    client = e2e.sdk(e2e.new_tenant("hostile"))
    submitted: dict[str, str] = {}
    started = time.monotonic()
    for name, (endpoint, bad, _code) in FAILING.items():
        valid = _code is None
        lines = [bad] if valid else [_good(endpoint, "ok-1"), bad, _good(endpoint, "ok-2")]
        upload = client.files.create(file=(f"{name}.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id,
            endpoint=endpoint if endpoint == TENSOR else "/v1/embeddings",
            completion_window="24h",
        )
        submitted[name] = batch.id
    refused_batches = {endpoint: _refused_batch(client, endpoint) for endpoint in {c[0] for c in REFUSED.values()}}
    submitted.update({f"refused {endpoint}": batch_id for endpoint, batch_id in refused_batches.items()})
    assert requests.get(f"{e2e.stack.base_url}/healthz", timeout=5).status_code == 200

    # Bounded: validation of ~90 small files and a few MiniLM lines take seconds here; 3x margin and more.
    deadline = time.monotonic() + 180
    final: dict[str, object] = {}
    while len(final) < len(submitted) and time.monotonic() < deadline:
        for name, batch_id in submitted.items():
            if name not in final:
                batch = client.batches.retrieve(batch_id)
                if batch.status in TERMINAL:
                    final[name] = batch
        time.sleep(0.5)
    stuck = sorted(set(submitted) - set(final))
    assert not stuck, f"not terminal after 180 s: {stuck}"

    for endpoint in refused_batches:
        batch = final[f"refused {endpoint}"]
        cases = {name: case[2] for name, case in REFUSED.items() if case[0] == endpoint}
        assert batch.status == "completed", (endpoint, batch.status, batch.errors)
        assert (batch.request_counts.completed, batch.request_counts.failed) == (2, len(cases)), endpoint
        records = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
        got = {r["custom_id"]: (r["response"]["status_code"], r["response"]["body"]["error"]["code"]) for r in records}
        assert got == {name: (400, code) for name, code in cases.items()}, endpoint
        assert all(r["response"]["body"]["error"]["param"] for r in records), endpoint
    for name, (_endpoint, _bad, code) in FAILING.items():
        batch = final[name]
        if code is None:
            assert batch.status == "completed", (name, batch.status, batch.errors)
            assert (batch.request_counts.completed, batch.request_counts.failed) == (1, 0), name
        else:
            assert batch.status == "failed", (name, batch.status)
            errors = [(e.line, e.code) for e in batch.errors.data]
            assert errors == [(2, code)], (name, errors)
    assert requests.get(f"{e2e.stack.base_url}/healthz", timeout=5).status_code == 200
    print(f"{len(RUNNABLE)} hostile cases terminal in {time.monotonic() - started:.1f} s")


def test_hostile_generation_lines_are_400_lines_naming_the_field(e2e):
    client = e2e.sdk(e2e.new_tenant("hostile-generation"))
    lines = generation_lines()
    batch = submit(client, lines, endpoint=CHAT)
    # Bounded: validation tokenizes ~20 lines and tinylm runs three short ones (loaded on first use, ~10 s).
    batch = e2e.wait_status(client, batch.id, {"completed", "failed", "expired", "cancelled"}, timeout_s=180)
    assert batch.status == "completed", (batch.status, batch.errors)
    output, errors = assert_exactly_once(client, batch, lines)
    assert [r["custom_id"] for r in output] == ["ok-1", "ok-2", "ok-3"]
    for record in output:
        completion = ChatCompletion.model_validate(record["response"]["body"])
        assert completion.model == MODEL and completion.choices[0].finish_reason in ("stop", "length")
    got = {
        r["custom_id"]: (
            r["response"]["status_code"],
            r["response"]["body"]["error"]["param"],
            r["response"]["body"]["error"]["code"],
        )
        for r in errors
    }
    # The error file names the field as a path in the line (controlplane/kinds/generation/kind.py): body.<param>.
    expected = {name: (400, f"body.{param}", code) for name, (_changes, param, code) in GENERATION_CASES.items()}
    assert got == expected
    # Refused lines are not billed: the batch's input tokens are the completed lines' prompts only.
    assert batch.usage.input_tokens == sum(r["response"]["body"]["usage"]["prompt_tokens"] for r in output)
