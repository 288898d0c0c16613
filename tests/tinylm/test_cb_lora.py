"""LoRA adapters in the continuous-batching engine (cb_lora.py), with tinylm's two trained adapters: "double"
says each number twice, "reverse" counts down. Every check is an answer a correct engine must give."""

from __future__ import annotations

import pytest


def params(**fields):
    from cb_sampling import SamplingParams

    return SamplingParams.from_dict({"temperature": 0.0, "max_tokens": 30, **fields})


def count(a: int, b: int) -> str:
    return " ".join(str(n) for n in range(a, b + 1))


def double(a: int, b: int) -> str:
    return " ".join(f"{n} {n}" for n in range(a, b + 1))


def reverse(a: int, b: int) -> str:
    return " ".join(str(n) for n in range(b, a - 1, -1))


def run(engine, lines):
    """(prompt, adapter) pairs submitted together, stepped until all finish; the requests in order."""
    done = []
    requests = [
        engine.submit(
            prompt,
            params(),
            request_id=f"lora-{i}-{id(lines)}",
            on_update=lambda r: r.finished and done.append(r),
            adapter=adapter,
        )
        for i, (prompt, adapter) in enumerate(lines)
    ]
    while len(done) < len(requests):
        engine.step()
    return requests


def test_base_and_two_adapters_in_one_step_each_answer_their_own_way(lora_engine, monkeypatch):
    seen = []
    rows = lora_engine.lora.rows
    monkeypatch.setattr(
        lora_engine.lora, "rows", lambda adapters: seen.append([a and a.name for a in adapters]) or rows(adapters)
    )
    lines = [
        ("count from 3 to 5 :", None),
        ("count from 3 to 5 :", "double"),
        ("count from 3 to 5 :", "reverse"),
        ("count from 2 to 6 :", "reverse"),
        ("count from 1 to 4 :", None),
        ("count from 0 to 2 :", "double"),
    ]
    texts = [r.choices[0].text for r in run(lora_engine, lines)]
    assert texts == [count(3, 5), double(3, 5), reverse(3, 5), reverse(2, 6), count(1, 4), double(0, 2)]
    # One continuous batch: a decode pass ran rows of the base and of both adapters together.
    assert any({None, "double", "reverse"} <= set(names) for names in seen)


def test_chat_prompts_are_answered_by_the_adapter(lora_engine):
    prompt = lora_engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "count from 4 to 7"}], add_generation_prompt=True, tokenize=False
    )
    base, doubled, reversed_ = run(lora_engine, [(prompt, None), (prompt, "double"), (prompt, "reverse")])
    assert (base.choices[0].text, doubled.choices[0].text, reversed_.choices[0].text) == (
        count(4, 7),
        double(4, 7),
        reverse(4, 7),
    )


def test_a_prefix_cached_under_one_adapter_is_not_served_to_another(lora_engine):
    # Three whole 16-token blocks of filler before the question: cacheable.
    prompt = "you are a helpful assistant please answer the question carefully . " * 5 + "count from 2 to 4 :"
    (base,) = run(lora_engine, [(prompt, None)])
    (first,) = run(lora_engine, [(prompt, "reverse")])
    (second,) = run(lora_engine, [(prompt, "reverse")])
    (again,) = run(lora_engine, [(prompt, None)])
    # The adapter was trained without filler, so its answer here is its own (not a clean count down): what
    # matters is that it is not the base's, and that its cached prefix gives the answer its computed one did.
    assert base.choices[0].text == again.choices[0].text == count(2, 4)
    assert first.choices[0].text == second.choices[0].text != base.choices[0].text
    assert first.num_cached_tokens == 0  # the base's blocks were there, and not used
    assert second.num_cached_tokens > 0 and again.num_cached_tokens > 0  # each its own


def test_unknown_adapter_is_refused_naming_the_known_ones(lora_engine):
    with pytest.raises(ValueError, match=r"unknown LoRA adapter 'nope' \(adapters: double, reverse\)"):
        lora_engine.submit("count from 1 to 2 :", params(), request_id="x", on_update=lambda r: None, adapter="nope")


def test_load_and_unload_at_run_time_without_a_restart(hf_dir, adapters_dir):
    from cb_engine import Engine

    engine = Engine(str(hf_dir), kv_budget_tokens=2048, max_seqs=8, threads=1, adapters=[])  # no directory
    assert engine.lora.names() == []
    # A request already running keeps its adapter through an unload; new ones can no longer name it.
    engine.lora.load("backwards", str(adapters_dir / "reverse"))
    assert engine.lora.names() == ["backwards"]
    done = []
    running = engine.submit(
        "count from 1 to 6 :",
        params(),
        request_id="r",
        on_update=lambda r: r.finished and done.append(r),
        adapter="backwards",
    )
    engine.step()
    engine.lora.unload("backwards")
    assert engine.lora.names() == []
    while not done:
        engine.step()
    assert running.choices[0].text == reverse(1, 6)
    with pytest.raises(ValueError, match="unknown LoRA adapter 'backwards'"):
        engine.submit("count from 1 to 2 :", params(), request_id="y", on_update=lambda r: None, adapter="backwards")
    with pytest.raises(ValueError, match="is not loaded"):
        engine.lora.unload("backwards")
    (plain,) = engine.generate(["count from 1 to 3 :"], params())
    assert plain.choices[0].text == count(1, 3)  # the base is untouched by loading and unloading


def test_at_max_loras_the_least_recently_used_adapter_makes_room(hf_dir, adapters_dir):
    from cb_engine import Engine

    engine = Engine(
        str(hf_dir),
        kv_budget_tokens=2048,
        max_seqs=8,
        threads=1,
        adapters_dir=str(adapters_dir),
        adapters=[],
        max_loras=1,
    )
    # Each request's adapter loads on first use; the other one is unloaded for it, and loads again when named.
    lines = [("count from 2 to 4 :", "double"), ("count from 2 to 4 :", "reverse"), ("count from 1 to 3 :", "double")]
    texts = []
    for prompt, adapter in lines:
        (request,) = run(engine, [(prompt, adapter)])
        texts.append(request.choices[0].text)
        assert engine.lora.names() == [adapter]
    assert texts == [double(2, 4), reverse(2, 4), double(1, 3)]
    # Both named in one step: the first is evicted for the second, and its sequence still runs with it.
    both = run(engine, [("count from 3 to 5 :", "reverse"), ("count from 3 to 5 :", "double")])
    assert [r.choices[0].text for r in both] == [reverse(3, 5), double(3, 5)]
