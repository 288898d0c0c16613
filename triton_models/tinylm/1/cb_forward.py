"""The engine's KV pool and its two batched forward passes over any Hugging Face causal LM.

All KV lives in one preallocated pool per layer of exactly `kv_budget_tokens` token slots: running sequences
own contiguous segments (prompt + max_tokens long, reserved at admission), cached prefix blocks own segments
of one block. Memory is therefore the budget, by construction, never more. A pass gathers the rows it needs
with one index per layer (right-padded, masked), so a step costs O(layers) tensor operations, not
O(layers x sequences); every HF causal LM takes the 2-D attention mask and explicit position ids this needs.
The gather leaves room for the pass's new tokens (`_GatheredLayer`), so the model writes them in place: a
DynamicCache would copy the gathered past twice more per layer and step (into itself, then `torch.cat` with
the new token), which was a third of a decode step on the mixed corpus.

A decode step of the model families whose attention is plain scaled dot-product (Llama, GPT-2) gathers nothing:
each row's new key and value are written into its pool segment, and attention runs per row on the segment
itself, a strided view (`_pool_attention`, registered with transformers as the attention implementation
"cb_pool"). On SmolLM2 (32 rows, contexts of 40–350 tokens) the gather and one padded attention took 9.6 ms a
layer, the per-row attention on views 1.9 ms: the gather was 44% of a decode step. Prefill keeps the gathered,
padded pass (its cost is the layers' matrix products).
"""

from __future__ import annotations

import bisect
import functools
import inspect
import threading
from collections.abc import Sequence
from typing import Any

import torch


# Families whose attention is plain scaled dot-product over the past (no sliding window, no soft-capping, no
# position bias in the attention itself): their decode steps attend on the pool directly.
_POOL_ATTENTION_FAMILIES = frozenset({"llama", "gpt2"})
_POOL_ATTENTION = "cb_pool"
_decode_rows = threading.local()  # (start, length) per row while a pool-attention decode pass runs


def _pool_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """Attention for `_POOL_ATTENTION`: in a decode pass, `key`/`value` are the pool's layer tensors [tokens,
    kv_heads, head_dim] (`_PoolLayer.update`) and each row attends to its own segment, a view; any other pass
    (prefill) is transformers' SDPA on the gathered cache, with its mask."""
    rows = getattr(_decode_rows, "segments", None)
    if rows is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = query.new_empty(query.shape)  # [rows, heads, 1, head_dim]
    gqa = query.shape[1] != key.shape[1]
    for row, (start, length) in enumerate(rows):
        keys = key[start : start + length].permute(1, 0, 2).unsqueeze(0)
        values = value[start : start + length].permute(1, 0, 2).unsqueeze(0)
        out[row] = torch.nn.functional.scaled_dot_product_attention(
            query[row : row + 1], keys, values, scale=scaling, enable_gqa=gqa
        )[0]
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _register_pool_attention() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(_POOL_ATTENTION, _pool_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(_POOL_ATTENTION, sdpa_mask)  # prefill's padded rows need SDPA's mask


@functools.cache
def _pool_layer_class() -> type:
    """A decode pass's cache layer: `update` writes each row's new key and value into the pool at its slot and
    returns the pool's tensors, which `_pool_attention` reads per row (nothing is gathered)."""
    from transformers.cache_utils import DynamicLayer

    class PoolLayer(DynamicLayer):
        def __init__(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor, past: int) -> None:
            super().__init__()
            self.keys, self.values, self.slots, self.past = keys, values, slots, past
            self.device, self.is_initialized = keys.device, True

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            self.keys[self.slots] = key_states[:, :, -1]
            self.values[self.slots] = value_states[:, :, -1]
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.past

    return PoolLayer


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
        self.pool_attention = getattr(model.config, "model_type", "") in _POOL_ATTENTION_FAMILIES
        if self.pool_attention:
            _register_pool_attention()
            model.set_attn_implementation(_POOL_ATTENTION)
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
        input_ids, positions = torch.tensor(last_tokens).unsqueeze(1), length_t.unsqueeze(1)
        if self.pool_attention:
            from transformers import DynamicCache

            cache = DynamicCache()
            layer_class = _pool_layer_class()
            cache.layers = [
                layer_class(k, v, slots, index.shape[1]) for k, v in zip(self.keys, self.values, strict=True)
            ]
            _decode_rows.segments = [(start, length + 1) for start, length in zip(starts, lengths, strict=True)]
            try:
                return self._run(cache, input_ids, mask, positions).logits[:, -1]
            finally:
                _decode_rows.segments = None
        # One more column per row for the new token (its gathered value is overwritten by the pass).
        cache = _gathered_cache(self.keys, self.values, torch.cat([index, slots.unsqueeze(1)], dim=1), index.shape[1])
        out = self._run(cache, input_ids, mask, positions)
        for layer, kv in enumerate(_cache_of(out).layers):
            self.keys[layer][slots] = kv.keys[:, :, -1]
            self.values[layer][slots] = kv.values[:, :, -1]
        return out.logits[:, -1]
