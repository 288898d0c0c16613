"""The engine's KV pool and its two batched forward passes over any Hugging Face causal LM.

All KV lives in one preallocated pool per layer of exactly `kv_budget_tokens` token slots: running sequences
own contiguous segments (prompt + max_tokens long, reserved at admission), cached prefix blocks own segments
of one block. Memory is therefore the budget, by construction, never more. A pass gathers the rows it needs
with one index per layer (right-padded, masked), so a step costs O(layers) tensor operations, not
O(layers x sequences); every HF causal LM takes the 2-D attention mask and explicit position ids this needs.
The gather leaves room for the pass's new tokens (`_GatheredLayer`), so the model writes them in place: a
DynamicCache would copy the gathered past twice more per layer and step (into itself, then `torch.cat` with
the new token), which was a third of a decode step on the mixed corpus (docs/PERFORMANCE.md, session 12).
"""

from __future__ import annotations

import bisect
import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@functools.cache
def _gathered_layer_class() -> type:
    """A cache layer over gathered views with room for the pass's new tokens: `update` writes them in place and
    returns the views (a DynamicLayer would concatenate, copying the whole past)."""
    from transformers.cache_utils import DynamicLayer

    class GatheredLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor, past: int) -> None:
            super().__init__()
            self.keys, self.values, self.past = keys, values, past
            self.device, self.is_initialized = keys.device, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.keys[:, :, self.past : self.past + key_states.shape[-2]] = key_states
            self.values[:, :, self.past : self.past + value_states.shape[-2]] = value_states
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.past

    return GatheredLayer


def _gathered_cache(keys: list[torch.Tensor], values: list[torch.Tensor], index: torch.Tensor, past: int) -> Any:
    """A DynamicCache whose layers hold the pool's slots `index` [rows, past + new] as [rows, heads, past + new,
    head_dim] views of one gather each; the last `new` columns are filled by the forward pass itself."""
    from transformers import DynamicCache

    layer_class = _gathered_layer_class()
    rows, width = index.shape
    flat = index.reshape(-1)
    cache = DynamicCache()
    for pool_keys, pool_values in zip(keys, values, strict=True):
        shape = (rows, width, *pool_keys.shape[1:])
        cache.layers.append(
            layer_class(
                pool_keys.index_select(0, flat).view(shape).transpose(1, 2),
                pool_values.index_select(0, flat).view(shape).transpose(1, 2),
                past,
            )
        )
    return cache


class KVPool:
    """`tokens` KV slots per layer ([tokens, kv_heads, head_dim] keys and values) and a first-fit allocator of
    contiguous segments over them."""

    def __init__(self, model: Any, cache_kwarg: str, tokens: int) -> None:
        from transformers import DynamicCache

        self.model, self.cache_kwarg, self.tokens = model, cache_kwarg, tokens
        # Only the last position's logits are read: without this the LM head ran over every prompt token of a
        # prefill, [rows, tokens, vocab], which for SmolLM2's 49k vocabulary cost more than the layers.
        parameters = inspect.signature(model.forward).parameters
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        # The shapes (layers, KV heads, head dim, dtype) come from one real forward pass: no per-architecture
        # config reading (GQA, head_dim overrides) to get wrong.
        with torch.inference_mode():
            probe = model(
                input_ids=torch.zeros((1, 1), dtype=torch.long, device=model.device),
                use_cache=True,
                **{cache_kwarg: DynamicCache()},
            )
        layers = _cache_of(probe).layers
        self.keys = [layer.keys.new_zeros((tokens, layer.keys.shape[1], layer.keys.shape[3])) for layer in layers]
        self.values = [
            layer.values.new_zeros((tokens, layer.values.shape[1], layer.values.shape[3])) for layer in layers
        ]
        self._free: list[tuple[int, int]] = [(0, tokens)]  # (start, length), sorted by start
        self.used_tokens = 0

    def allocate(self, length: int) -> int | None:
        for index, (start, free) in enumerate(self._free):
            if free >= length:
                self._free[index : index + 1] = [(start + length, free - length)] if free > length else []
                self.used_tokens += length
                return start
        return None

    def release(self, start: int, length: int) -> None:
        index = bisect.bisect(self._free, (start, length))
        self._free.insert(index, (start, length))
        # Merge with the neighbours so that freed space becomes whole again.
        if index + 1 < len(self._free) and start + length == self._free[index + 1][0]:
            self._free[index] = (start, length + self._free.pop(index + 1)[1])
        if index > 0 and self._free[index - 1][0] + self._free[index - 1][1] == start:
            prev_start, prev_length = self._free[index - 1]
            self._free[index - 1 : index + 1] = [(prev_start, prev_length + self._free[index][1])]
        self.used_tokens -= length

    def copy(self, source: int, target: int, length: int) -> None:
        for pool in (*self.keys, *self.values):
            pool[target : target + length] = pool[source : source + length]

    def _run(self, cache: Any, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> Any:
        device = self.model.device
        with torch.inference_mode():
            return self.model(
                input_ids=input_ids.to(device),
                attention_mask=mask.to(device),
                position_ids=positions.to(device),
                use_cache=True,
                **{self.cache_kwarg: cache},
                **self._last_logits,
            )

    def prefill(
        self, past: torch.Tensor, tails: Sequence[Sequence[int]], targets: Sequence[int], pad_id: int
    ) -> torch.Tensor:
        """Run prompt tails, each after the same cached prefix (pool slots `past`, possibly empty), in one pass;
        write each row's whole prompt KV (prefix + tail) at its `targets` segment start. Returns the last
        position's logits per row [rows, vocab]."""
        rows, longest, start = len(tails), max(len(t) for t in tails), len(past)
        # The prefix's slots, then room for the tails (column values are overwritten by the pass).
        room = torch.cat([past, torch.zeros(longest, dtype=torch.long)]) if start else None
        cache = (
            _gathered_cache(self.keys, self.values, room.unsqueeze(0).expand(rows, -1), start)
            if room is not None
            else self._cache_empty()
        )
        input_ids = torch.full((rows, longest), pad_id, dtype=torch.long)
        mask = torch.zeros((rows, start + longest), dtype=torch.long)
        mask[:, :start] = 1
        positions = torch.full((rows, longest), start, dtype=torch.long)
        for row, tail in enumerate(tails):  # left padding: every row's last prompt token in the last column
            pad = longest - len(tail)
            input_ids[row, pad:] = torch.tensor(tail)
            mask[row, start + pad :] = 1
            positions[row, pad:] = torch.arange(start, start + len(tail))
        out = self._run(cache, input_ids, mask, positions)
        for layer, kv in enumerate(_cache_of(out).layers):
            for row, (tail, target) in enumerate(zip(tails, targets, strict=True)):
                pad = longest - len(tail)
                for pool, new in ((self.keys[layer], kv.keys), (self.values[layer], kv.values)):
                    pool[target : target + start] = new[row, :, :start].transpose(0, 1)
                    pool[target + start : target + start + len(tail)] = new[row, :, start + pad :].transpose(0, 1)
        return out.logits[:, -1]

    def _cache_empty(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache()

    def decode(self, starts: Sequence[int], lengths: Sequence[int], last_tokens: Sequence[int]) -> torch.Tensor:
        """One decode step for every row (a segment at `starts[row]` holding `lengths[row]` tokens): writes the
        new token's KV at `starts + lengths`, returns the next-token logits [rows, vocab]."""
        start_t, length_t = torch.tensor(starts), torch.tensor(lengths)
        columns = torch.arange(int(length_t.max()))
        valid = columns.unsqueeze(0) < length_t.unsqueeze(1)  # right padding, masked
        index = torch.where(valid, start_t.unsqueeze(1) + columns, 0)
        mask = torch.cat([valid.long(), torch.ones((len(starts), 1), dtype=torch.long)], dim=1)
        slots = start_t + length_t
        # One more column per row for the new token (its gathered value is overwritten by the pass).
        cache = _gathered_cache(self.keys, self.values, torch.cat([index, slots.unsqueeze(1)], dim=1), index.shape[1])
        out = self._run(cache, torch.tensor(last_tokens).unsqueeze(1), mask, length_t.unsqueeze(1))
        for layer, kv in enumerate(_cache_of(out).layers):
            self.keys[layer][slots] = kv.keys[:, :, -1]
            self.values[layer][slots] = kv.values[:, :, -1]
        return out.logits[:, -1]
