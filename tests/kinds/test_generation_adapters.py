"""LoRA adapters in the catalogue and the API: `base:adapter` is listed by /v1/models, accepted in a batch of its
base (beside the base and its other adapters), sent to the engine as vLLM's backend's `lora_name` sampling
parameter, and refused as a 400
line naming body.model when the base has no such adapter; another model's adapter is another model."""

from __future__ import annotations

import io
import json

import pytest

from controlplane.batches.intake.requests import ModelResolver, parse_line
from controlplane.batches.intake.validation import validate_input
from controlplane.fleet.models import CatalogueAdapter, CatalogueModel
from controlplane.kinds.generation.engine import engine_request

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"


def chat_line(custom_id: str, model: str) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "count from 3 to 5"}], "max_tokens": 12}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": body}).encode()


def validate(*lines: bytes):
    content = b"\n".join(lines)
    return validate_input(io.BytesIO(content), endpoint=CHAT, max_line_bytes=4096, max_lines=100, shard_lines=10)


def parse(line: bytes):
    return parse_line(line, endpoint=CHAT, resolver=ModelResolver())


def test_one_batch_runs_the_base_and_its_adapters(catalogue):
    result = validate(chat_line("a", "tinylm"), chat_line("b", "tinylm:double"), chat_line("c", "tinylm:reverse"))
    assert result.ok and result.model == "tinylm" and result.body_errors == 0
    # A batch led by an adapter line is its base's batch as well.
    led = validate(chat_line("a", "tinylm:reverse"), chat_line("b", "tinylm"))
    assert led.ok and led.model == "tinylm"


def test_the_adapter_travels_to_the_engine_as_lora_name(catalogue):
    tinylm = CatalogueModel.objects.get(name="tinylm")
    base, adapted = parse(chat_line("a", "tinylm")), parse(chat_line("b", "tinylm:double"))
    assert adapted.model_name == "tinylm:double" and adapted.request.request.model == "tinylm:double"
    assert "lora_name" not in engine_request("1", base.request.request, model=tinylm).sampling_parameters
    assert engine_request("2", adapted.request.request, model=tinylm).sampling_parameters["lora_name"] == "double"


def test_an_unknown_or_disabled_adapter_is_a_400_line_naming_body_model(catalogue):
    CatalogueAdapter.objects.filter(name="reverse").update(is_enabled=False)
    for name in ("tinylm:nope", "tinylm:reverse", "tinylm:"):
        parsed = parse(chat_line("x", name))
        assert parsed.request is None and parsed.issue.code == "model_not_found"
        assert parsed.issue.param == "body.model"
        assert f"'{name}' does not exist" in parsed.issue.message
        assert "its adapters: tinylm:double" in parsed.issue.message
    # The batch runs on: its other lines are good.
    result = validate(chat_line("a", "tinylm"), chat_line("b", "tinylm:nope"))
    assert result.ok and result.body_errors == 1


def test_an_adapter_of_another_base_is_refused(catalogue):
    smollm2 = CatalogueModel.objects.get(name="smollm2-135m-instruct")
    CatalogueAdapter.objects.create(base=smollm2, name="pirate", path="adapters/pirate")
    # On tinylm it is no adapter at all: a 400 line.
    issue = parse(chat_line("x", "tinylm:pirate")).issue
    assert issue.code == "model_not_found" and "'tinylm' has no adapter 'pirate'" in issue.message
    # Named with its own base, it is another model than the batch's: the batch fails, as mixed models do.
    result = validate(chat_line("a", "tinylm:double"), chat_line("b", "smollm2-135m-instruct:pirate"))
    assert [(e["line"], e["code"], e["param"]) for e in result.errors] == [(2, "mixed_models", "body.model")]
    assert "'tinylm:<adapter>'" in result.errors[0]["message"]
    # A model that does not exist stays an envelope error.
    unknown = validate(chat_line("a", "nosuch:double"))
    assert [e["code"] for e in unknown.errors] == ["model_not_found"]


def test_models_lists_each_adapter_as_a_model_of_its_own(api):
    body = api.get("/v1/models").json()
    by_id = {m["id"]: m for m in body["data"]}
    assert {"tinylm", "tinylm:double", "tinylm:reverse"} <= set(by_id)
    double = by_id["tinylm:double"]
    assert double["parent"] == "tinylm" and double["endpoints"] == by_id["tinylm"]["endpoints"]
    assert "parent" not in by_id["tinylm"]
    assert api.get("/v1/models/tinylm:reverse").json()["parent"] == "tinylm"
    CatalogueAdapter.objects.filter(name="reverse").update(is_enabled=False)
    missing = api.get("/v1/models/tinylm:reverse")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert "tinylm:reverse" not in {m["id"] for m in api.get("/v1/models").json()["data"]}
    assert api.get("/v1/models/tinylm:nope").status_code == 404
