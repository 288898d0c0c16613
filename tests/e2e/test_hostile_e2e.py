"""The hostile-input corpus of tests/batches/test_hostile_input.py through the running service: uploaded
with the openai SDK, validated by a real Celery worker, every case ends in a terminal state within a
bounded time (a failed batch whose error names line 2 and the case's code, or, for the odd-but-valid
cases, a completed batch), and the API keeps answering throughout."""

from __future__ import annotations

import io
import time

import pytest
import requests

from tests.batches.helpers import jsonl
from tests.batches.test_hostile_input import CASES, DTYPES, TENSOR, _good

pytestmark = pytest.mark.e2e

TERMINAL = {"completed", "failed", "expired", "cancelled"}
# Odd-but-valid tensor lines name typed-* models that no Triton serves; they are accepted by validation
# (tests/batches) and would wait for a placement forever here, so only the rejected typed cases run.
RUNNABLE = {name: case for name, case in CASES.items() if not (case[2] is None and b'"typed-' in case[1])}

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
    for name, (endpoint, bad, _code) in RUNNABLE.items():
        valid = _code is None
        lines = [bad] if valid else [_good(endpoint, "ok-1"), bad, _good(endpoint, "ok-2")]
        upload = client.files.create(file=(f"{name}.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
        batch = client.batches.create(
            input_file_id=upload.id,
            endpoint=endpoint if endpoint == TENSOR else "/v1/embeddings",
            completion_window="24h",
        )
        submitted[name] = batch.id
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

    for name, (_endpoint, _bad, code) in RUNNABLE.items():
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
