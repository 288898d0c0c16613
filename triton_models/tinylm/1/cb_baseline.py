"""The static-batching baseline the continuous-batching engine is measured against (cb vs static)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def static_generate(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_tokens: Sequence[int], *, batch_size: int
) -> list[list[int]]:
    """Baseline for benchmarks: Hugging Face `generate`, greedy, in static batches of `batch_size` prompts in
    the given order, each batch running to its longest max_tokens (or all rows at EOS). Returns each prompt's
    generated token ids, cut at its own max_tokens and first EOS."""
    eos = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    results: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start : start + batch_size])
        limits = list(max_tokens[start : start + batch_size])
        batch = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=max(limits), do_sample=False, pad_token_id=tokenizer.pad_token_id
            )
        for row, limit in enumerate(limits):
            ids = out[row, batch["input_ids"].shape[1] :].tolist()[:limit]
            results.append(ids[: ids.index(eos) + 1] if eos in ids else ids)
    return results
