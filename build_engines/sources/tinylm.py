"""tinylm: a tiny causal LM trained at install on a grammar whose right answers are known.

No causal LM ships on PyPI and no model hub can be reached, so `make install` trains one (seeded, bit for bit;
53 s on the 2 cores when quiet, 64 s at load ~5): a 2-layer GPT-2 (n_embd 64, 143k parameters) that learns

    count from 3 to 9 :3 4 5 6 7 8 9<eos>
    count from 3 to 6 as json :{"numbers":[3,4,5,6]}<eos>

as a plain completion, and the same tasks as a chat (an optional system message of filler words, up to ~200
tokens, so a benchmark can share a long system prompt). The tokenizer is byte-level BPE as GPT-2's (all 256
bytes in the alphabet, a few hundred merges learned from the synthetic corpus), so any text encodes and decodes
exactly: constrained decoding (JSON) needs a vocabulary that can spell `{`, `"` and any string. The JSON
answers are a small share of the corpus so that the model's own preferences under a JSON grammar are sensible. Multi-turn chats were tried and left out: with an
earlier exchange in the prompt the 2-layer model often counted the earlier question (78% exact vs 95%). The output is a normal Hugging Face model directory (config.json,
model.safetensors, tokenizer.json + tokenizer_config.json with a Jinja `chat_template`, generation_config.json)
that AutoModelForCausalLM / AutoTokenizer load like any other: tests assert the grammar, never exact bits.

    python -m build_engines.sources.tinylm triton_models/tinylm/1/hf
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

MAX_NUMBER = 40  # numbers 0..40 are one token each (checked): outputs run up to 41 tokens + <eos>
MAX_SPAN = 24  # b - a during training; longer spans are not asked for in the tests or the benchmark
N_POSITIONS = 256  # room for a ~200-token shared system prompt plus the question and its answer
FILLER = ["you", "are", "a", "helpful", "assistant", "please", "answer", "the", "question", "carefully", "."]
SPECIAL = ["<pad>", "<eos>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
# At most 256 bytes + 6 special tokens + 250 merges; the trainer stops earlier (~410) once every word of the
# corpus is one token, numbers 0..40 with and without their leading space included (build_tokenizer checks).
VOCAB_SIZE = 512
# A small share of examples ask for the count as a compact JSON object, with short spans: at 15% and spans up
# to 24 the 2-layer model got 85% of all answers exact and no longer all of the plain counts (measured).
JSON_SHARE = 0.1
JSON_SPAN = 8
# One message is "<|role|> content <eos>"; the generation prompt opens the assistant's turn. Role words are
# special tokens so that no user text can forge them.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|> {{ message['content'] }} <eos> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SEED = 20261201
LONG_EVERY = 3  # every 3rd training batch has a long filler prefix


def _corpus(seed: int, size: int = 4000) -> list[str]:
    """Plain text of the tasks (questions, answers, filler), for learning the BPE merges."""
    rng = random.Random(seed)
    lines = []
    for _ in range(size):
        as_json = rng.random() < JSON_SHARE
        a, b = _question(rng, as_json)
        lines.append(f"{_filler(rng, 20)} {_ask(a, b, as_json)} :{answer(a, b, as_json=as_json)}")
    return lines


def build_tokenizer(seed: int = SEED) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE(unk_token=None))
    # GPT-2's scheme: bytes mapped to printable characters, a space kept as the start of the next word.
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_corpus(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=["<|system|>", "<|user|>", "<|assistant|>"],
        model_max_length=N_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    for n in range(MAX_NUMBER + 1):
        for spelling in (str(n), f" {n}"):
            if len(tokenizer(spelling, add_special_tokens=False)["input_ids"]) != 1:
                raise SystemExit(f"tinylm's tokenizer splits {spelling!r}: raise VOCAB_SIZE")
    return tokenizer


def _ask(a: int, b: int, as_json: bool) -> str:
    return f"count from {a} to {b}" + (" as json" if as_json else "")


def answer(a: int, b: int, *, as_json: bool = False) -> str:
    """The completion, EOS included: it follows the prompt's ":" (or the assistant's turn) without a space."""
    numbers = list(range(a, b + 1))
    if as_json:
        return json.dumps({"numbers": numbers}, separators=(",", ":")) + "<eos>"
    return " ".join(str(n) for n in numbers) + "<eos>"


def _question(rng: random.Random, as_json: bool = False) -> tuple[int, int]:
    a = rng.randint(0, MAX_NUMBER)
    return a, rng.randint(a, min(MAX_NUMBER, a + (JSON_SPAN if as_json else MAX_SPAN)))


def _filler(rng: random.Random, longest: int) -> str:
    length = rng.randint(1, longest)
    if rng.random() < 0.5:  # a phrase said over and over, as real system prompts repeat their rules
        phrase = [rng.choice(FILLER) for _ in range(rng.randint(2, 8))]
        return " ".join(phrase[i % len(phrase)] for i in range(length))
    return " ".join(rng.choice(FILLER) for _ in range(length))


def example(
    rng: random.Random, tokenizer: Any, *, long_prefix: bool = False, as_json: bool | None = None
) -> tuple[str, str]:
    """(prompt, completion) drawn from the grammar: half plain completions, half chats. `long_prefix` puts up
    to 200 words of filler first (a system message in chats), as the benchmark's shared-prefix corpus does."""
    if as_json is None:
        as_json = rng.random() < JSON_SHARE
    a, b = _question(rng, as_json)
    if rng.random() < 0.5:
        prefix = _filler(rng, 200) + " " if long_prefix else ""
        return f"{prefix}{_ask(a, b, as_json)} :", answer(a, b, as_json=as_json)
    messages = []
    if long_prefix or rng.random() < 0.4:
        messages.append({"role": "system", "content": _filler(rng, 200 if long_prefix else 12)})
    messages.append({"role": "user", "content": _ask(a, b, as_json)})
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return prompt, answer(a, b, as_json=as_json)


def _batch(rng: random.Random, tokenizer: Any, size: int, *, long_prefix: bool) -> tuple[Any, Any, Any]:
    import torch

    rows = []
    for _ in range(size):
        prompt, completion = example(rng, tokenizer, long_prefix=long_prefix)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids + completion_ids, len(prompt_ids)))
    width = min(N_POSITIONS, max(len(ids) for ids, _ in rows))
    input_ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(rows):
        ids = ids[:width]
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        # Loss on the answer only: the question's numbers are random and the filler is noise by design.
        labels[row, prompt_len : len(ids)] = input_ids[row, prompt_len : len(ids)]
    return input_ids, mask, labels


def train(out_dir: Path, *, steps: int = 1000, batch_size: int = 32, seed: int = SEED) -> dict[str, Any]:
    import torch
    from transformers import GenerationConfig, GPT2Config, GPT2LMHeadModel

    started = time.monotonic()
    # One thread: the batches are small, and on a shared 2-core host two threads meeting at every operator
    # made a step 10x slower (1.2 s vs 0.11 s at load average 14, measured).
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    tokenizer = build_tokenizer()
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=N_POSITIONS,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps, pct_start=0.1)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        # Long-prefix rows get batches of their own, smaller: mixed in, every batch would be padded to ~230
        # tokens and training took 460 s instead of ~60 (measured, 2 shared cores). They come often, or the
        # positions past ~100 stay undertrained and answers after a long system prompt stop short.
        long_prefix = step % LONG_EVERY == LONG_EVERY - 1
        size = batch_size // 3 if long_prefix else batch_size
        input_ids, mask, labels = _batch(rng, tokenizer, size, long_prefix=long_prefix)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=False
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    report = {
        "seed": seed,
        "steps": steps,
        "batch_size": batch_size,
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_loss": round(sum(losses[-20:]) / 20, 4),
        "train_seconds": round(time.monotonic() - started, 1),
        "exact_greedy": greedy_accuracy(model, tokenizer, as_json=False),
        "json_greedy": greedy_accuracy(model, tokenizer, as_json=True, trials=20),
    }
    # The manifest: how this directory was built (the artefact is not committed; this records its recipe).
    (out_dir / "tinylm_manifest.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def greedy_accuracy(model: Any, tokenizer: Any, *, as_json: bool, trials: int = 40) -> float:
    """Share of fresh questions (plain and chat; counts, or counts as JSON) answered exactly, EOS included, by
    greedy decoding."""
    import torch

    rng = random.Random(7)
    right = 0
    for trial in range(trials):
        prompt, completion = example(rng, tokenizer, long_prefix=trial % 4 == 0, as_json=as_json)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids, max_new_tokens=MAX_SPAN + 3 if not as_json else 2 * JSON_SPAN + 12, do_sample=False
            )
        got = tokenizer.decode(out[0, ids.shape[1] :].tolist())
        right += got.startswith(completion)
    return right / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args()
    report = train(args.out_dir, steps=args.steps)
    print(json.dumps(report))
    if report["exact_greedy"] < 0.9:
        raise SystemExit(f"tinylm did not learn its grammar well enough: {report}")


if __name__ == "__main__":
    main()
