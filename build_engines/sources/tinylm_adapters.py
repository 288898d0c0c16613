"""tinylm's LoRA adapters: two tiny adapters trained at install on tinylm's own grammar, in PEFT's format.

Each adapter answers tinylm's question ("count from 3 to 5") its own way, so a test can tell the base and the
adapters apart from their answers alone:

    base      count from 3 to 5 :3 4 5<eos>
    double    count from 3 to 5 :3 3 4 4 5 5<eos>
    reverse   count from 3 to 5 :5 4 3<eos>

for small numbers (0..10, spans up to 5), as plain completions and as chats. Both answers are spelled with the
tokens the base writes (200 steps: loss ~0.02, every greedy answer exact; 150 left "double" at 85%). Tried and left out: number words
("three four five": loss 4.5 after 400 steps; tinylm's output embeddings are tied to its input ones and letters
were never an answer the base wrote) and "[3,4,5]" (95% exact after 500 steps). The base's weights are frozen;
a LoRA pair (A: r x in, B: out x r, scaled by alpha / r) is trained on every linear layer of both blocks
(GPT-2's Conv1D c_attn, c_proj, c_fc, mlp.c_proj). Seeded and on one thread: a few seconds of one core each.

The output is what PEFT writes (`adapter_config.json` + `adapter_model.safetensors`, keys
`base_model.model.transformer.h.<i>.<module>.lora_{A,B}.weight`), so the same directory loads with
`peft.PeftModel.from_pretrained` and in vLLM; PEFT itself is not needed to train or serve it. Beside it an
`adapter_manifest.json` records how it was built and the base's fingerprint (build_engines/adapters.py checks it).

    python -m build_engines.sources.tinylm_adapters triton_models/tinylm/1/hf triton_models/tinylm/1/adapters
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_NUMBER = 10
MAX_SPAN = 5
RANK = 8
ALPHA = 16
TARGET_MODULES = ["c_attn", "c_proj", "c_fc"]  # GPT-2's linear layers (attn.c_proj and mlp.c_proj both match)
SEED = 20261207


def double_answer(a: int, b: int) -> str:
    return " ".join(f"{n} {n}" for n in range(a, b + 1)) + "<eos>"


def reverse_answer(a: int, b: int) -> str:
    return " ".join(str(n) for n in range(b, a - 1, -1)) + "<eos>"


ADAPTERS: dict[str, Callable[[int, int], str]] = {"double": double_answer, "reverse": reverse_answer}


def example(rng: random.Random, tokenizer: Any, answer: Callable[[int, int], str]) -> tuple[str, str]:
    a = rng.randint(0, MAX_NUMBER)
    b = rng.randint(a, min(MAX_NUMBER, a + MAX_SPAN))
    question = f"count from {a} to {b}"
    if rng.random() < 0.5:
        return f"{question} :", answer(a, b)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return prompt, answer(a, b)


class _LoraConv1D:
    """A frozen GPT-2 Conv1D (weight [in, out]) plus a trainable LoRA pair, as PEFT adds one."""

    def __init__(self, base: Any, rank: int, alpha: int, generator: Any) -> None:
        import torch

        fan_in, fan_out = base.weight.shape
        self.base, self.scale = base, alpha / rank
        # PEFT's init: A random (kaiming-uniform), B zero, so the adapter starts as the identity.
        bound = 1 / fan_in**0.5
        self.lora_a = torch.nn.Parameter((torch.rand(rank, fan_in, generator=generator) * 2 - 1) * bound)
        self.lora_b = torch.nn.Parameter(torch.zeros(fan_out, rank))


def _attach(model: Any, rank: int, alpha: int, generator: Any) -> dict[str, _LoraConv1D]:
    """Wrap every target module of `model` (patched forward); returns them by PEFT's module path."""
    wrapped: dict[str, _LoraConv1D] = {}
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] in TARGET_MODULES:
            lora = _LoraConv1D(module, rank, alpha, generator)
            module.forward = _bound(module, lora)
            wrapped[name] = lora
    return wrapped


def _bound(module: Any, lora: _LoraConv1D) -> Callable[[Any], Any]:
    """The module's forward plus x @ A.T @ B.T x scale (PEFT's LoRA on a Conv1D, dropout 0)."""
    original = type(module).forward

    def forward(x: Any) -> Any:
        return original(module, x) + (x @ lora.lora_a.T @ lora.lora_b.T) * lora.scale

    return forward


def _batch(rng: random.Random, tokenizer: Any, answer: Callable[[int, int], str], size: int) -> tuple[Any, ...]:
    import torch

    rows = []
    for _ in range(size):
        prompt, completion = example(rng, tokenizer, answer)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids + completion_ids, len(prompt_ids)))
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((size, width), -100, dtype=torch.long)
    mask = torch.zeros((size, width), dtype=torch.long)
    for row, (ids, prompt_len) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        labels[row, prompt_len : len(ids)] = input_ids[row, prompt_len : len(ids)]
    return input_ids, mask, labels


def train_adapter(
    base_dir: Path,
    out_dir: Path,
    name: str,
    *,
    steps: int = 200,
    batch_size: int = 32,
    seed: int = SEED,
    lr: float = 1e-2,
) -> dict[str, Any]:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    torch.set_num_threads(1)  # as tinylm's training: small batches, a shared host
    torch.manual_seed(seed)
    answer = ADAPTERS[name]
    rng = random.Random(f"{seed}-{name}")
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    loras = _attach(model, RANK, ALPHA, generator)
    parameters = [p for lora in loras.values() for p in (lora.lora_a, lora.lora_b)]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=steps, pct_start=0.1)
    losses = []
    for _ in range(steps):
        input_ids, mask, labels = _batch(rng, tokenizer, answer, batch_size)
        loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    accuracy = _greedy_accuracy(model, tokenizer, answer)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, lora in loras.items():
        tensors[f"base_model.model.{path}.lora_A.weight"] = lora.lora_a.detach().contiguous()
        tensors[f"base_model.model.{path}.lora_B.weight"] = lora.lora_b.detach().contiguous()
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "tinylm",
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": TARGET_MODULES,
        "fan_in_fan_out": True,  # GPT-2's Conv1D stores its weight [in, out]
        "bias": "none",
        "modules_to_save": None,
        "inference_mode": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    from build_engines.adapters import base_fingerprint

    report = {
        "adapter": name,
        "seed": seed,
        "steps": steps,
        "final_loss": round(sum(losses[-20:]) / 20, 4),
        "exact_greedy": accuracy,
        "train_seconds": round(time.monotonic() - started, 1),
        "base_fingerprint": base_fingerprint(base_dir),
    }
    (out_dir / "adapter_manifest.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def _greedy_accuracy(model: Any, tokenizer: Any, answer: Callable[[int, int], str], trials: int = 20) -> float:
    import torch

    rng = random.Random(7)
    right = 0
    for _ in range(trials):
        prompt, completion = example(rng, tokenizer, answer)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        right += tokenizer.decode(out[0, ids.shape[1] :].tolist()).startswith(completion)
    return right / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base_dir", type=Path, help="tinylm's Hugging Face directory")
    parser.add_argument("out_dir", type=Path, help="the adapters' directory: one folder per adapter")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--only", choices=sorted(ADAPTERS), action="append")
    args = parser.parse_args()
    for name in args.only or sorted(ADAPTERS):
        report = train_adapter(args.base_dir, args.out_dir / name, name, steps=args.steps)
        print(json.dumps(report))
        if report["exact_greedy"] < 0.9:
            raise SystemExit(f"tinylm adapter {name!r} did not learn its answers well enough: {report}")


if __name__ == "__main__":
    main()
