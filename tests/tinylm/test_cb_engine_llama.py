"""The engine on a real Llama: SmolLM2-135M-Instruct (`make install` converts it into triton_models/smollm2/1/hf),
greedy, against transformers' own `generate` one prompt at a time (no padding, no batching, no cache of ours).

What tinylm (a GPT-2 with learned positions and one KV head per query head) cannot check: RoPE positions per
sequence in a batched, padded prefill and decode, grouped-query KV heads (3 for 9 query heads) in the pool, and
a prompt prefilled after cached prefix blocks at positions that start past zero."""

from __future__ import annotations

from pathlib import Path

import pytest

SMOLLM2_DIR = Path(__file__).resolve().parents[2] / "triton_models" / "smollm2" / "1" / "hf"
SYSTEM = (
    "You are a careful assistant for a railway company. Answer in one short sentence, politely, and only "
    "with facts you are sure of. If you do not know, say so plainly and suggest where to look."
)
QUESTIONS = ["What is a train?", "Why do trains run on rails?", "What is a ticket for?"]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def llama_engine():
    from cb_engine import Engine

    if not (SMOLLM2_DIR / "model.safetensors").exists():
        pytest.fail(f"{SMOLLM2_DIR} is missing: `make install` converts it (build_engines/sources/smollm2.py)")
    # One thread: the suite's workers share two cores, where a second intra-op thread only spins (4x the CPU
    # seconds beside the rest of the suite); the numerics under test do not depend on it.
    return Engine(str(SMOLLM2_DIR), kv_budget_tokens=2048, max_seqs=8, threads=1, max_model_len=512)


@pytest.fixture(scope="module")
def reference(llama_engine):
    """transformers' greedy tokens for a prompt, computed once per prompt: both tests ask for the same three."""
    answers: dict[str, list[int]] = {}

    def greedy(prompt: str) -> list[int]:
        if prompt not in answers:
            answers[prompt] = _reference(llama_engine, prompt)
        return answers[prompt]

    return greedy


def _reference(engine, prompt: str) -> list[int]:
    import torch

    ids = engine.tokenizer(prompt, add_special_tokens=True, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = engine.model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS)
    return out[0, ids.shape[1] :].tolist()


def test_batched_greedy_with_cached_prefixes_is_transformers_greedy(llama_engine, reference):
    from cb_sampling import SamplingParams

    engine = llama_engine
    assert engine.pool.keys[0].shape[1:] == (3, 64)  # the pool holds the 3 KV heads, not the 9 query heads
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for q in QUESTIONS
    ]
    params = SamplingParams.from_json(f'{{"max_tokens": {NEW_TOKENS}, "temperature": 0, "ignore_eos": true}}')
    first = engine.generate(prompts[:1], params)  # fills the prefix cache with the shared system prompt's blocks
    rest = engine.generate(prompts[1:], params)  # one padded prefill after the cached blocks, then batched decode
    assert first[0].num_cached_tokens == 0 and all(r.num_cached_tokens >= 48 for r in rest)
    for prompt, request in zip(prompts, first + rest, strict=True):
        assert request.choices[0].token_ids == reference(prompt)


def test_prompts_sharing_a_prefix_in_one_step_compute_it_once(llama_engine, reference):
    """Lines that share a system prompt arrive together: the first is prefilled and cached, the others start
    from its blocks in a second round of the same step, and every answer is still transformers' greedy."""
    from cb_sampling import SamplingParams

    engine = llama_engine
    engine.prefix_cache.evict(engine.prefix_cache.held_tokens)
    prompts = [
        engine.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=False,
        )
        for q in reversed(QUESTIONS)
    ]
    params = SamplingParams.from_json(f'{{"max_tokens": {NEW_TOKENS}, "temperature": 0, "ignore_eos": true}}')
    requests = engine.generate(prompts, params)
    assert requests[0].num_cached_tokens == 0 and all(r.num_cached_tokens >= 48 for r in requests[1:])
    for prompt, request in zip(prompts, requests, strict=True):
        assert request.choices[0].token_ids == reference(prompt)
