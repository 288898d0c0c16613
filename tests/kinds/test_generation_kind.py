"""The generation kinds (kinds/generation/kind.py) on their own: bodies parsed with the model's tokenizer into
work units or a 400 naming the field, and the run against a fake engine (tests/kinds/fake_engine.py; the
real one in test_generation_batch.py): every line once, bounded lines in flight, a long line holding back
no other, a stop cancelling what is out, per-line and stream errors, logprobs in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion

from controlplane.fleet.catalogue.seed import SEED
from controlplane.fleet.models import CatalogueModel
from controlplane.kinds.base import BodyIssue, LineFailure, LineOutcome, LineOutput, ParsedLine
from controlplane.kinds.generation import kind as generation
from controlplane.kinds.generation.units import line_output_bytes
from controlplane.kinds.registry import kind_for
from controlplane.triton.errors import TransientTritonError
from tests.contracts.openai_schema import validate
from tests.kinds.fake_engine import FakeEngine, FakeStream

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def tinylm(**changes: Any) -> CatalogueModel:
    """The shipped catalogue entry, unsaved (its tokenizer is the trained model's, written by make install)."""
    return CatalogueModel(**{**next(e for e in SEED if e["name"] == "tinylm"), **changes})


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": "tinylm", "messages": [{"role": "user", "content": content}], **fields}


class Control:
    def __init__(self, stop_when: Callable[[Control], bool] = lambda control: False) -> None:
        self.finished: dict[int, LineOutcome] = {}
        self.order: list[int] = []
        self.stop_when = stop_when

    def check(self) -> bool:
        return self.stop_when(self)

    def finish(self, number: int, outcome: LineOutcome) -> None:
        assert number not in self.finished, f"line {number} reported twice"
        self.finished[number] = outcome
        self.order.append(number)

    def request_id(self, number: int) -> str:
        return f"rid{number:04d}"


def parsed_lines(url: str, bodies: list[dict[str, Any]], model: CatalogueModel) -> dict[int, ParsedLine]:
    kind, lines = kind_for(url), {}
    for number, body in enumerate(bodies, start=1):
        try:
            lines[number] = ParsedLine(f"c{number}", model.name, kind.parse_body(body, model=model))
        except BodyIssue as issue:
            lines[number] = ParsedLine(f"c{number}", model.name, None, issue)
    return lines


def run(url: str, bodies: list[dict[str, Any]], *, engine: FakeEngine | None = None, control: Control | None = None):
    model = tinylm()
    engine, control = engine or FakeEngine(), control or Control()
    stopped = kind_for(url).run(
        parsed_lines(url, bodies, model), model=model, backend=engine, control=control, inflight=3
    )
    return stopped, control, engine


# --- parse_body ------------------------------------------------------------------------------------


def test_a_bad_body_is_a_body_issue_naming_the_field_under_body():
    kind, model = kind_for(CHAT), tinylm()
    cases = [
        (chat("count from 1 to 3", temperature=5), "body.temperature", "decimal_above_max_value"),
        (chat("count from 1 to 3", max_tokens=1000), "body.max_tokens", "context_length_exceeded"),
        ({"model": "tinylm", "messages": []}, "body.messages", "empty_array"),
        (chat("count from 1 to 3", stream=True), "body.stream", "unsupported_value"),
        (chat("x", response_format={"type": "json_object"}), "body.messages", "invalid_value"),  # no word JSON
    ]
    for body, param, code in cases:
        with pytest.raises(BodyIssue) as refused:
            kind.parse_body(body, model=model)
        assert refused.value.param == param, body
        assert refused.value.code == code, body
    with pytest.raises(BodyIssue) as refused:
        kind_for(COMPLETIONS).parse_body({"model": "tinylm", "prompt": ["a", "b"]}, model=model)
    assert refused.value.param == "body.prompt"


def test_work_units_are_the_prompt_plus_every_choice_at_its_limit_weighted():
    body = chat("count from 1 to 3", max_tokens=10, n=3)
    line = kind_for(CHAT).parse_body(body, model=tinylm(completion_weight=1.0))
    prompt = line.request.prompt_tokens
    assert prompt > 0 and kind_for(CHAT).work_units(line) == prompt + 3 * 10
    heavy = kind_for(CHAT).parse_body(body, model=tinylm(completion_weight=2.5))
    assert kind_for(CHAT).work_units(heavy) == prompt + 75


def test_the_tokenizer_is_loaded_once_and_a_missing_one_is_a_clear_error(tmp_path):
    assert generation.model_tokenizer(tinylm()) is generation.model_tokenizer(tinylm())
    with pytest.raises(generation.ModelMisconfigured, match="no tokenizer at"):
        generation.model_tokenizer(tinylm(tokenizer_dir=str(tmp_path)))
    with pytest.raises(generation.ModelMisconfigured, match="context_length"):
        kind_for(CHAT).parse_body(chat("x"), model=tinylm(context_length=None))


# --- run -------------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_preloading_loads_the_enabled_generation_models_tokenizers_only(catalogue, monkeypatch):
    # What each shard-worker process runs as it starts (controlplane/celery.py), so that its first generation
    # shard does not import transformers.
    from controlplane.fleet.models import ModelKind

    monkeypatch.setattr(generation, "_tokenizers", {})
    monkeypatch.setattr(generation, "_tokenizers_by_setting", {})
    CatalogueModel.objects.filter(kind=ModelKind.GENERATION).exclude(name="tinylm").update(is_enabled=False)
    CatalogueModel.objects.create(
        name="off",
        kind=ModelKind.GENERATION,
        triton_name="off",
        tokenizer_dir="triton_models/tinylm/1/hf",
        is_enabled=False,
        max_batch_size=0,
    )
    assert generation.tokenizers_preload() == ["tinylm"]
    assert list(generation._tokenizers) == [generation.tokenizer_path(tinylm()).resolve()]


def test_every_line_is_answered_once_in_openais_shapes():
    bodies = [chat(f"count from {a} to {a + 4}", max_tokens=20) for a in range(6)]
    bodies[2] = chat("count from 1 to 3", temperature=9)  # refused at parse: a 400 without reaching the engine
    bodies[4] = chat("REJECT count from 1 to 3")  # refused by the engine: a 400 too
    stopped, control, engine = run(CHAT, bodies)
    assert not stopped and sorted(control.finished) == list(range(1, 7))
    assert len(engine.submitted) == 5 and engine.streams[0].closed is False  # closed without cancel
    for number, outcome in control.finished.items():
        if number in (3, 5):
            assert isinstance(outcome, LineFailure) and outcome.status_code == 400
            assert outcome.param == ("body.temperature" if number == 3 else None)
            continue
        assert isinstance(outcome, LineOutput)
        validate(outcome.body, "CreateChatCompletionResponse")
        completion = ChatCompletion.model_validate(outcome.body)
        a = number - 1
        assert completion.id == f"chatcmpl-rid{number:04d}" and completion.model == "tinylm"
        assert completion.choices[0].message.content == " ".join(str(v) for v in range(a, a + 5))
        assert completion.choices[0].finish_reason == "stop"
        usage = completion.usage
        assert usage.completion_tokens == 6 == outcome.completion_tokens and outcome.tokens == usage.prompt_tokens
        assert (outcome.cached_tokens, outcome.choices) == (usage.prompt_tokens_details.cached_tokens, 1)


def test_sampling_fields_reach_the_engine_in_vllms_names():
    body = chat("count from 1 to 30", max_tokens=4, n=2, seed=7, stop=["9"], temperature=0.5, top_p=0.9)
    body |= {"presence_penalty": 0.5, "frequency_penalty": -0.5, "logprobs": True, "top_logprobs": 2}
    _, control, engine = run(CHAT, [body])
    (sent,) = engine.submitted
    assert sent.sampling_parameters == {
        "max_tokens": 4,
        "temperature": 0.5,
        "top_p": 0.9,
        "n": 2,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "seed": 7,
        "stop": ["9"],
        "logprobs": 2,
    }
    assert sent.prompt.endswith("<|assistant|>") and "logprobs" in sent.outputs and "num_cached_tokens" in sent.outputs
    # The ids validation counted go with the text to an engine that takes them (tinylm's own input).
    (line,) = parsed_lines(CHAT, [body], tinylm()).values()
    assert sent.prompt_token_ids == line.request.request.prompt_token_ids and len(sent.prompt_token_ids) > 5
    body = control.finished[1].body
    validate(body, "CreateChatCompletionResponse")
    assert [c["finish_reason"] for c in body["choices"]] == ["length", "length"]
    content = body["choices"][1]["logprobs"]["content"]
    assert [entry["token"] for entry in content] == ["1", "2", "3", "4"]
    # The sampled token is the first key (rank 2 here); its alternatives are the top 2 by rank.
    assert content[0]["logprob"] == -0.5
    assert [alt["token"] for alt in content[0]["top_logprobs"]] == ["alt1", "1"]
    assert body["usage"]["completion_tokens"] == 8  # both choices


def test_completions_are_text_completions_with_legacy_logprobs():
    body = {"model": "tinylm", "prompt": "count from 5 to 8 :", "max_tokens": 10, "logprobs": 1}
    _, control, _ = run(COMPLETIONS, [body])
    outcome = control.finished[1]
    validate(outcome.body, "CreateCompletionResponse")
    completion = Completion.model_validate(outcome.body)
    assert completion.id == "cmpl-rid0001" and completion.choices[0].text == "5 6 7 8"
    assert completion.choices[0].logprobs.tokens == ["5", "6", "7", "8", "<eos>"]


def test_a_model_without_the_engines_extras_is_not_asked_for_them():
    # vLLM's backend refuses inputs it does not know: only a model that declares an extra gets it.
    model = tinylm(inputs=[])
    engine, control = FakeEngine(), Control()
    lines = parsed_lines(CHAT, [chat("count from 1 to 2")], model)
    kind_for(CHAT).run(lines, model=model, backend=engine, control=control, inflight=1)
    assert "num_cached_tokens" not in engine.submitted[0].outputs
    assert engine.submitted[0].prompt_token_ids is None
    assert control.finished[1].body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_lines_in_flight_are_bounded_and_refilled_as_lines_finish():
    model = tinylm(max_num_seqs=2)
    engine = FakeEngine()

    def engine_step(control: Control) -> bool:
        # Between two looks of the run at its control, the engine answers everything it holds: what the
        # run had out at once is then exactly what it sent in one go.
        for stream in engine.streams:
            stream.release()
        return False

    control = Control(stop_when=engine_step)
    lines = parsed_lines(CHAT, [chat(f"HOLD count from 1 to {b}") for b in range(2, 12)], model)
    kind_for(CHAT).run(lines, model=model, backend=engine, control=control, inflight=1)
    assert sorted(control.finished) == list(range(1, 11)) and engine.max_outstanding == 4  # 2 x max_num_seqs
    assert len(engine.streams) == 1 and len(engine.submitted) == 10


def test_lines_in_flight_are_bounded_by_the_output_they_may_write(settings):
    # Four may be out by max_num_seqs; the output window holds two of these lines, or one line larger than it.
    model = tinylm(max_num_seqs=2)
    lines = parsed_lines(
        CHAT,
        [chat(f"HOLD count from 1 to {b}", logprobs=True, top_logprobs=5, max_tokens=16) for b in range(2, 8)],
        model,
    )
    line_bytes = line_output_bytes(lines[1].request.request, expected_completion_tokens=None)
    for window, most_out in ((int(2.5 * line_bytes), 2), (line_bytes // 2, 1)):
        settings.GENERATION_INFLIGHT_OUTPUT_BYTES = window
        engine = FakeEngine()

        def engine_step(control: Control, engine: FakeEngine = engine) -> bool:
            for stream in engine.streams:
                stream.release()
            return False

        control = Control(stop_when=engine_step)
        kind_for(CHAT).run(lines, model=model, backend=engine, control=control, inflight=1)
        assert sorted(control.finished) == list(range(1, 7))
        assert engine.max_outstanding == most_out, (window, line_bytes)


def test_a_long_line_holds_back_no_other():
    bodies = [chat("HOLD count from 1 to 40"), *(chat(f"count from 1 to {b}") for b in range(2, 6))]
    engine = FakeEngine()

    def release_the_long_one_last(stream: FakeStream, request: Any) -> None:
        if len(engine.submitted) == len(bodies):
            stream.release()

    engine.on_submit = release_the_long_one_last
    _, control, _ = run(CHAT, bodies, engine=engine)
    assert control.order == [2, 3, 4, 5, 1]


def test_a_stop_sends_nothing_new_cancels_what_is_out_and_keeps_what_finished():
    model = tinylm(max_num_seqs=1)  # two in flight
    bodies = [chat("count from 1 to 3"), chat("HOLD count from 1 to 9"), *(chat("count from 1 to 2") for _ in range(5))]
    engine = FakeEngine()
    control = Control(stop_when=lambda c: len(c.finished) >= 1)
    stopped = kind_for(CHAT).run(
        parsed_lines(CHAT, bodies, model), model=model, backend=engine, control=control, inflight=1
    )
    assert stopped and list(control.finished) == [1]
    assert len(engine.submitted) == 2 and engine.streams[0].closed is True  # the held line is cancelled


def test_a_broken_stream_raises_transient_and_cancels_the_rest():
    engine = FakeEngine(transient_after=2)
    with pytest.raises(TransientTritonError):
        run(CHAT, [chat(f"HOLD count from 1 to {b}") for b in range(2, 8)], engine=engine)
    assert engine.streams[0].closed is True


def test_silence_from_the_engine_is_a_hung_server(settings):
    settings.TRITON_TIMEOUT_SECONDS = 0.3
    engine = FakeEngine()
    with pytest.raises(TransientTritonError, match="no response"):
        run(CHAT, [chat("HOLD count from 1 to 3")], engine=engine)
    assert engine.streams[0].closed is True


def test_an_answer_that_is_not_a_completion_is_a_server_error_line(monkeypatch):
    from tests.kinds import fake_engine

    real = fake_engine.answer

    def abort(request):
        response = real(request)
        response.finish_reasons = ["abort"]
        return response

    monkeypatch.setattr(fake_engine, "answer", abort)
    _, control, _ = run(CHAT, [chat("count from 1 to 3")])
    failure = control.finished[1]
    assert isinstance(failure, LineFailure) and failure.status_code == 500 and "abort" in failure.message
    json.dumps(failure._asdict())  # storable as an error-file line


def test_lines_sharing_a_prompt_prefix_are_sent_together():
    # System prompts longer than the grouping key (generation/run.py's PREFIX_KEY_TOKENS), told apart by their start.
    system_a = {"role": "system", "content": "you " + "are a helpful assistant " * 10}
    system_b = {"role": "system", "content": "please " + "answer the question carefully " * 10}
    bodies = []
    for a in range(6):
        body = chat(f"count from {a} to {a + 2}")
        body["messages"].insert(0, system_a if a % 2 else system_b)
        bodies.append(body)
    _, control, engine = run(CHAT, bodies)
    assert sorted(control.finished) == list(range(1, 7))  # every line answered, whatever the sending order
    prompts = [request.prompt for request in engine.submitted]
    firsts = [prompt.split("<|user|>")[0] for prompt in prompts]
    # Each system prompt's lines form one run of consecutive submissions, the first line's group first.
    assert len([i for i in range(1, len(firsts)) if firsts[i] != firsts[i - 1]]) == 1
    assert "please" in firsts[0]
    # Without shared prefixes the file order stands.
    _, _, plain = run(CHAT, [chat(f"count from {a} to {a + 2}") for a in range(5)])
    assert [request.prompt.split()[3] for request in plain.submitted] == ["0", "1", "2", "3", "4"]


def test_a_line_over_the_output_budget_is_a_400_naming_the_field(settings):
    settings.GENERATION_MAX_LINE_OUTPUT_UNITS = 100
    kind, model = kind_for(CHAT), tinylm()
    assert kind.parse_body(chat("count from 1 to 3", max_tokens=10, n=8), model=model).request.output_units == 80
    with pytest.raises(BodyIssue) as caught:
        kind.parse_body(chat("count from 1 to 3", max_tokens=10, n=8, logprobs=True), model=model)
    assert (caught.value.code, caught.value.param) == ("output_too_large", "body.max_tokens")
