"""An in-process continuous-batching (iteration-level) text generation engine over any Hugging Face causal LM.

No Triton import: the Triton model (model.py next to this file) and an in-process benchmark drive the same
engine. Sequences join and leave between decode steps. A KV budget in tokens, explicit and bounded (never
sized from host memory), bounds what runs: a request is admitted only when the KV of all its choices at
their longest (prompt + max_tokens each) fits beside what runs already and the prefix cache
(guaranteed_no_evict: nothing admitted is ever preempted). Each choice owns a KV buffer of exactly that size;
a decode step left-pads the running choices' KV into one batch, runs one forward pass, and writes each new
token's KV back into its owner's buffer.

Why our own loop rather than transformers' continuous batching (`init_continuous_batching`): in
transformers 5.24 its sampling settings are per manager, not per request (temperature/top_p at most; no
per-request seed, n, penalties, stop strings or logprobs), and one shared RNG makes a seeded output depend on
its batch neighbours. Measured on the mixed corpus (docs/ARCHITECTURE.md, "Generation engine"), greedy only,
this loop was also the faster of the two here.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from cb_prefix import PrefixCache
from cb_sampling import SamplingParams, TokenPick, choice_generator, pick_tokens

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class Choice:
    """One of a request's n completions. Read it inside `on_update`; the engine thread owns it."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", "abort"
    picks: list[TokenPick] = field(default_factory=list)  # per generated token, when logprobs were asked
    cumulative_logprob: float = 0.0
    stable_chars: int = 0  # text[:stable_chars] can no longer change (a stop string may still cut the rest)
    # engine state
    kv: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list, repr=False)
    length: int = 0  # tokens whose KV is in `kv`
    generator: torch.Generator | None = field(default=None, repr=False)
    counts: torch.Tensor | None = field(default=None, repr=False)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    on_update: Callable[[Request], None]
    is_cancelled: Callable[[], bool] | None = None
    stream: bool = False  # keep each choice's text current every step (else only with stop strings, and at the end)
    choices: list[Choice] = field(default_factory=list)
    num_cached_tokens: int = 0
    finished: bool = False
    error: str | None = None  # set with finished when the engine failed this request
    reserved_tokens: int = 0

    @property
    def cancelled(self) -> bool:
        return self.finished and any(c.finish_reason == "abort" for c in self.choices)


class Engine:
    def __init__(
        self,
        model_dir: str,
        *,
        kv_budget_tokens: int,
        max_seqs: int = 64,
        block_size: int = 16,
        max_prefill_tokens_per_step: int = 1024,
        device: str = "cpu",
        threads: int | None = None,
        prefix_caching: bool = True,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(self.device).eval()
        config = self.model.config
        # transformers 5.x renamed the cache argument (`past_key_values` warns, then goes in 5.40); older
        # releases (a GPU image may ship one) know only the old name.
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        )
        self.context_length = int(getattr(config, "max_position_embeddings", 0) or self.tokenizer.model_max_length)
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self.kv_budget_tokens = kv_budget_tokens
        self.max_seqs = max_seqs
        self.max_prefill_tokens_per_step = max_prefill_tokens_per_step
        self.prefix_cache = PrefixCache(block_size) if prefix_caching else None
        self.reserved_tokens = 0
        self.peak_reserved_tokens = 0  # reserved + prefix cache, highest seen: tests hold it to the budget
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._inbox: collections.deque[Request] = collections.deque()
        self._cancels: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ---- called from any thread -------------------------------------------------------------------------
    def submit(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        *,
        request_id: str,
        on_update: Callable[[Request], None],
        is_cancelled: Callable[[], bool] | None = None,
        stream: bool = False,
    ) -> Request:
        """Queue a request; ValueError when it can never run (empty, over the context, over the budget)."""
        ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"] if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        if len(ids) + params.max_tokens > self.context_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's context "
                f"length ({self.context_length})"
            )
        need = params.n * (len(ids) + params.max_tokens)
        if need > self.kv_budget_tokens or params.n > self.max_seqs:
            raise ValueError(f"n x (prompt + max_tokens) = {need} tokens can never fit the KV budget")
        request = Request(request_id, ids, params, on_update, is_cancelled, stream, reserved_tokens=need)
        with self._lock:
            self._inbox.append(request)
        self._wake.set()
        return request

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step boundary (its finish_reason becomes "abort")."""
        with self._lock:
            self._cancels.add(request_id)
        self._wake.set()

    def start(self) -> None:
        """Run the step loop in a background thread until `stop()`."""
        self._thread = threading.Thread(target=self._loop, name="cb-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stopping:
            if not self.step():
                self._wake.wait(timeout=0.05)
                self._wake.clear()

    # ---- the engine thread ------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._inbox)

    def step(self) -> bool:
        """One iteration: take cancellations and arrivals, admit what fits, prefill it, decode one token for
        every running choice, hand out updates. Returns False when there was nothing to do."""
        with self._lock:
            self._waiting.extend(self._inbox)
            self._inbox.clear()
            cancels, self._cancels = self._cancels, set()
        for request in [*self._running, *self._waiting]:
            if request.request_id in cancels or (request.is_cancelled is not None and request.is_cancelled()):
                self._finish(request, abort=True)
        if not self._running and not self._waiting:
            return False
        try:
            for request in self._admit():
                self._prefill(request)
            if self._running:
                self._decode()
        except Exception as exc:  # noqa: BLE001 - a failed forward pass fails the requests in it, not the loop
            for request in list(self._running):
                request.error = f"{type(exc).__name__}: {exc}"
                self._finish(request, abort=False)
        return True

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        prefill_tokens = 0
        running_seqs = sum(len(r.choices) or r.params.n for r in self._running)
        while self._waiting:
            request = self._waiting[0]
            n = request.params.n
            if running_seqs + n > self.max_seqs or (admitted and prefill_tokens >= self.max_prefill_tokens_per_step):
                break  # first come, first served: the head waits rather than being overtaken
            cache_held = self.prefix_cache.held_tokens if self.prefix_cache else 0
            over = self.reserved_tokens + cache_held + request.reserved_tokens - self.kv_budget_tokens
            if over > 0 and self.prefix_cache is not None:
                over -= self.prefix_cache.evict(over)
            if over > 0:
                break
            self._waiting.popleft()
            self.reserved_tokens += request.reserved_tokens
            self._note_peak()
            running_seqs += n
            prefill_tokens += len(request.prompt_token_ids)
            admitted.append(request)
        return admitted

    def _note_peak(self) -> None:
        held = self.reserved_tokens + (self.prefix_cache.held_tokens if self.prefix_cache else 0)
        self.peak_reserved_tokens = max(self.peak_reserved_tokens, held)

    def _prefill(self, request: Request) -> None:
        from transformers import DynamicCache

        ids, params = request.prompt_token_ids, request.params
        cached_blocks = self.prefix_cache.lookup(ids) if self.prefix_cache else []
        cache = DynamicCache()
        for layer, pairs in enumerate(zip(*cached_blocks, strict=True) if cached_blocks else ()):
            keys = torch.cat([k for k, _ in pairs], dim=1).unsqueeze(0)
            values = torch.cat([v for _, v in pairs], dim=1).unsqueeze(0)
            cache.update(keys, values, layer)
        start = cache.get_seq_length()
        request.num_cached_tokens = start
        tail = torch.tensor([ids[start:]], device=self.device)
        with torch.inference_mode():
            out = self.model(
                input_ids=tail,
                attention_mask=torch.ones((1, len(ids)), dtype=torch.long, device=self.device),
                position_ids=torch.arange(start, len(ids), device=self.device).unsqueeze(0),
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
        prompt_kv = [(layer.keys[0], layer.values[0]) for layer in _cache_of(out).layers]
        capacity = len(ids) + params.max_tokens
        for index in range(params.n):
            choice = Choice(index=index, generator=choice_generator(params.seed, index), length=len(ids))
            for keys, values in prompt_kv:
                k = keys.new_empty((keys.shape[0], capacity, keys.shape[2]))
                v = values.new_empty((values.shape[0], capacity, values.shape[2]))
                k[:, : len(ids)], v[:, : len(ids)] = keys, values
                choice.kv.append((k, v))
            choice.counts = torch.zeros(out.logits.shape[-1])
            request.choices.append(choice)
        if self.prefix_cache is not None:
            room = self.kv_budget_tokens - self.reserved_tokens - self.prefix_cache.held_tokens
            self.prefix_cache.insert(ids, prompt_kv, room)
            self._note_peak()
        self._running.append(request)
        logits = out.logits[0, -1].expand(params.n, -1)
        self._accept(list(zip([request] * params.n, request.choices, strict=True)), logits)

    def _decode(self) -> None:
        from transformers import DynamicCache

        rows = [(r, c) for r in self._running for c in r.choices if c.finish_reason is None]
        longest = max(c.length for _, c in rows)
        mask = torch.zeros((len(rows), longest + 1), dtype=torch.long)
        mask[:, -1] = 1
        cache = DynamicCache()
        for layer in range(len(rows[0][1].kv)):
            k0, v0 = rows[0][1].kv[layer]
            keys = k0.new_zeros((len(rows), k0.shape[0], longest, k0.shape[2]))
            values = v0.new_zeros((len(rows), v0.shape[0], longest, v0.shape[2]))
            for row, (_, choice) in enumerate(rows):
                k, v = choice.kv[layer]
                # Left padding: every row's newest token sits in the same (last) column.
                keys[row, :, longest - choice.length :] = k[:, : choice.length]
                values[row, :, longest - choice.length :] = v[:, : choice.length]
                if layer == 0:
                    mask[row, longest - choice.length : longest] = 1
            cache.update(keys, values, layer)
        input_ids = torch.tensor([[c.token_ids[-1]] for _, c in rows], device=self.device)
        positions = torch.tensor([[c.length] for _, c in rows], device=self.device)
        with torch.inference_mode():
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask.to(self.device),
                position_ids=positions,
                use_cache=True,
                **{self._cache_kwarg: cache},
            )
        for layer, kv_layer in enumerate(_cache_of(out).layers):
            new_k, new_v = kv_layer.keys[:, :, -1], kv_layer.values[:, :, -1]
            for row, (_, choice) in enumerate(rows):
                choice.kv[layer][0][:, choice.length] = new_k[row]
                choice.kv[layer][1][:, choice.length] = new_v[row]
        for _, choice in rows:
            choice.length += 1
        self._accept(rows, out.logits[:, -1])

    def _accept(self, rows: list[tuple[Request, Choice]], logits: torch.Tensor) -> None:
        picks = pick_tokens(
            logits, [r.params for r, _ in rows], [c.generator for _, c in rows], [c.counts for _, c in rows]
        )
        touched: dict[str, Request] = {}
        for (request, choice), pick in zip(rows, picks, strict=True):
            touched[request.request_id] = request
            self._append(request, choice, pick)
        for request in touched.values():
            if all(c.finish_reason is not None for c in request.choices):
                self._finish(request, abort=False)
            else:
                self._notify(request)

    def _append(self, request: Request, choice: Choice, pick: TokenPick) -> None:
        params = request.params
        choice.token_ids.append(pick.token_id)
        choice.counts[pick.token_id] += 1
        choice.cumulative_logprob += pick.logprob
        if params.logprobs is not None:
            choice.picks.append(pick)
        is_eos = pick.token_id in self.eos_token_ids and not params.ignore_eos
        at_limit = len(choice.token_ids) >= params.max_tokens
        if is_eos or at_limit or params.stop or request.stream:
            # Decoding costs O(length): done only when someone reads the text before the end, or at the end.
            choice.text = self.tokenizer.decode(
                choice.token_ids[:-1] if is_eos else choice.token_ids, skip_special_tokens=True
            )
        cut = min((i for i in (choice.text.find(s) for s in params.stop) if i >= 0), default=-1)
        if cut >= 0:
            choice.text, choice.finish_reason = choice.text[:cut], "stop"
        elif is_eos:
            choice.finish_reason = "stop"
        elif at_limit:
            choice.finish_reason = "length"
        hold = max((len(s) - 1 for s in params.stop), default=0)
        choice.stable_chars = len(choice.text) if choice.finish_reason else max(0, len(choice.text) - hold)

    def _finish(self, request: Request, *, abort: bool) -> None:
        if request.finished:
            return
        if not request.choices:  # still waiting: never prefilled
            request.choices = [Choice(index=i) for i in range(request.params.n)]
        for choice in request.choices:
            if choice.finish_reason is None:
                choice.finish_reason = "abort"
            choice.kv = []  # frees the buffers now, not when the caller drops the request
        if request in self._running:
            self._running.remove(request)
            self.reserved_tokens -= request.reserved_tokens
        elif request in self._waiting:
            self._waiting.remove(request)
        request.finished = True
        self._notify(request)

    def _notify(self, request: Request) -> None:
        try:
            request.on_update(request)
        except Exception:  # a caller that cannot take its update loses its request, no one else's
            logger.exception("on_update of %s failed; cancelling it", request.request_id)
            if not request.finished:
                self.cancel(request.request_id)

    # ---- synchronous convenience (tests, benchmarks) ----------------------------------------------------
    def generate(
        self, prompts: Sequence[str | Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[Request]:
        """Submit all, step until all finished (no background thread); results in prompt order."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        done: list[Request] = []
        counter = itertools.count()
        requests = [
            self.submit(p, sp, request_id=f"gen-{next(counter)}-{time.monotonic_ns()}", on_update=_collect(done))
            for p, sp in zip(prompts, per_prompt, strict=True)
        ]
        while len(done) < len(requests):
            self.step()
        return requests


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _collect(done: list[Request]) -> Callable[[Request], None]:
    def on_update(request: Request) -> None:
        if request.finished:
            done.append(request)

    return on_update


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
