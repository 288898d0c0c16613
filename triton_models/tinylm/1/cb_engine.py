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
its batch neighbours. Measured on the mixed corpus (docs/architecture/generation.md, "The engine"), greedy only,
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

import torch
from cb_forward import KVPool
from cb_grammar import GrammarCompiler
from cb_lora import LoraRegistry
from cb_passes import prefill_rounds, similar_lengths
from cb_prefix import PrefixCache
from cb_request import Choice, Request, append_token
from cb_sampling import SamplingParams, choice_generator, pick_tokens
from cb_threads import name_os_thread

logger = logging.getLogger(__name__)


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
        max_model_len: int | None = None,
        cancel_poll_s: float = 0.05,
        cancel_poll_batch: int = 8,
        adapters_dir: str | None = None,
        adapters: Sequence[str] | None = (),
        max_loras: int = 0,
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
        if max_model_len:  # vLLM's max_model_len: a served context below the model's own (8192 for SmolLM2)
            self.context_length = min(self.context_length, max_model_len)
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos]) - {None}
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.kv_budget_tokens = kv_budget_tokens
        self.max_seqs = max_seqs
        self.max_prefill_tokens_per_step = max_prefill_tokens_per_step
        self.pool = KVPool(self.model, self._cache_kwarg, kv_budget_tokens)
        self.prefix_cache = PrefixCache(self.pool, block_size) if prefix_caching else None
        # LoRA adapters (cb_lora.py): `adapters` loaded now (None: every one in adapters_dir), any other one of
        # adapters_dir when a request first names it, or by `self.lora.load` (model.py's lora_control).
        self.lora = LoraRegistry(self.model, adapters_dir, max_loras)
        for name in self.lora.available() if adapters is None else adapters:
            self.lora.load(name)
        self._grammars: GrammarCompiler | None = None  # built at the first structured request
        self.reserved_tokens = 0  # by running sequences; the prefix cache holds the rest of pool.used_tokens
        self.peak_reserved_tokens = 0  # pool slots in use, highest seen: tests hold it to the budget
        self._waiting: collections.deque[Request] = collections.deque()
        self._running: list[Request] = []
        self._inbox: collections.deque[Request] = collections.deque()
        self._cancels: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Callers' is_cancelled is asked once per cancel_poll_s (0: every step), of at most cancel_poll_batch
        # requests in turn, so each is asked every ceil(in flight / batch) intervals: 0.8 s for the 128 a shard
        # keeps in flight, inside the second a cancel is allowed. Triton's is_cancelled is an IPC round trip
        # through the stub's and the server's threads: asked of every request every 50 ms, 512 in flight, it
        # held the engine thread 45% of the wall time on a loaded host (docs/performance.md).
        self.cancel_poll_s = cancel_poll_s
        self.cancel_poll_batch = cancel_poll_batch
        self._next_cancel_poll = 0.0
        self._cancel_cursor = 0

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
        adapter: str | None = None,
    ) -> Request:
        """Queue a request; ValueError when it can never run (empty, over the context, over the budget).

        Text is tokenized as vLLM tokenizes a text prompt, with the tokenizer's special tokens (a Llama BOS):
        the control plane sends chat prompts with the template's own BOS taken off the front, so that one BOS
        is prefilled, as it counted (kinds/generation/bodies.py). Token ids are taken as they are: the caller
        tokenized the text the same way (the control plane's validation does)."""
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"] if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        vocab = int(self.model.config.vocab_size)
        if not isinstance(prompt, str) and not all(0 <= token < vocab for token in ids):
            # An id past the embedding table would fail the forward pass of every request prefilled beside it.
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) + params.max_tokens > self.context_length:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's context "
                f"length ({self.context_length})"
            )
        need = params.n * (len(ids) + params.max_tokens)
        if need > self.kv_budget_tokens or params.n > self.max_seqs:
            raise ValueError(f"n x (prompt + max_tokens) = {need} tokens can never fit the KV budget")
        request = Request(request_id, ids, params, on_update, is_cancelled, stream, reserved_tokens=need)
        if adapter:  # its sequences run the base plus this LoRA adapter (ValueError: unknown adapter)
            request.adapter = self.lora.get(adapter)
        request.choices = [Choice(index=i, generator=choice_generator(params.seed, i)) for i in range(params.n)]
        if params.structured_outputs is not None:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, int(self.model.config.vocab_size))
            for choice in request.choices:  # compiled once per distinct schema, a matcher per choice
                choice.grammar = self._grammars.matcher(params.structured_outputs)
        with self._lock:
            self._inbox.append(request)
        self._wake.set()
        return request

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step boundary (its finish_reason becomes "abort"); a caller's own
        `is_cancelled` is seen within `cancel_poll_s` x ceil(requests in flight / `cancel_poll_batch`)."""
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
        name_os_thread("cb-engine")
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
        now = time.monotonic()
        poll = now >= self._next_cancel_poll
        if poll:
            self._next_cancel_poll = now + self.cancel_poll_s
        if cancels:
            for request in [*self._running, *self._waiting]:
                if request.request_id in cancels:
                    self._finish(request, abort=True)
        if poll:
            for request in self._to_poll():
                if request.is_cancelled is not None and request.is_cancelled():
                    self._finish(request, abort=True)
        if not self._running and not self._waiting:
            return False
        admitted: list[Request] = []
        try:
            admitted = self._admit()
            self._prefill(admitted)
            if self._running:
                self._decode()
        except Exception as exc:  # noqa: BLE001 - a failed forward pass fails the requests in it, not the loop
            # Admitted but not yet started (a prefill group after the one that failed) are in neither list.
            for request in dict.fromkeys([*self._running, *admitted]):
                request.error = f"{type(exc).__name__}: {exc}"
                self._finish(request, abort=False)
        return True

    def _to_poll(self) -> list[Request]:
        """The next cancel_poll_batch requests with an is_cancelled, round robin over running then waiting."""
        askable = [r for r in [*self._running, *self._waiting] if r.is_cancelled is not None]
        if len(askable) <= self.cancel_poll_batch:
            return askable
        start = self._cancel_cursor % len(askable)
        self._cancel_cursor = start + self.cancel_poll_batch
        return (askable[start:] + askable[:start])[: self.cancel_poll_batch]

    def _admit(self) -> list[Request]:
        admitted: list[Request] = []
        prefill_tokens = 0
        running_seqs = sum(r.params.n for r in self._running)
        while self._waiting:
            request = self._waiting[0]
            n = request.params.n
            if running_seqs + n > self.max_seqs or (admitted and prefill_tokens >= self.max_prefill_tokens_per_step):
                break  # first come, first served: the head waits rather than being overtaken
            starts = self._allocate(n, len(request.prompt_token_ids) + request.params.max_tokens)
            if starts is None:
                break
            for choice, start in zip(request.choices, starts, strict=True):
                choice.start = start
            self._waiting.popleft()
            self.reserved_tokens += request.reserved_tokens
            self._note_peak()
            running_seqs += n
            prefill_tokens += len(request.prompt_token_ids)
            admitted.append(request)
        return admitted

    def _allocate(self, n: int, length: int) -> list[int] | None:
        """n pool segments of `length` slots, evicting cached prefix blocks (least recently used first) for the
        room; None, with nothing held, when they do not fit beside what runs."""
        starts: list[int] = []
        while len(starts) < n:
            start = self.pool.allocate(length)
            if start is not None:
                starts.append(start)
            elif not (self.prefix_cache and self.prefix_cache.evict(length)):
                for held in starts:
                    self.pool.release(held, length)
                return None
        return starts

    def _note_peak(self) -> None:
        self.peak_reserved_tokens = max(self.peak_reserved_tokens, self.pool.used_tokens)

    def _prefill(self, admitted: list[Request]) -> None:
        """Prefill the admitted requests in two rounds (cb_passes.py): lines sharing a system prompt arrive
        together, and the later ones start from the first one's cached blocks instead of computing them again."""
        if self.prefix_cache is None or len(admitted) < 2:
            self._prefill_round(admitted)
            return
        first, later = prefill_rounds(admitted, self.prefix_cache)
        self._prefill_round(first)
        if later:
            self._prefill_round(later)

    def _prefill_round(self, admitted: list[Request]) -> None:
        """One batched pass (or a few, by length) per distinct cached prefix (usually one or two)."""
        groups: dict[int, tuple[list[int], list[Request]]] = {}
        for request in admitted:
            chain, blocks = (
                self.prefix_cache.lookup(request.prompt_token_ids, salt=request.cache_salt)
                if self.prefix_cache
                else (0, [])
            )
            groups.setdefault(chain, (blocks, []))[1].append(request)
        size = self.prefix_cache.block_size if self.prefix_cache else 0
        for blocks, group in groups.values():
            past = torch.tensor([slot + i for slot in blocks for i in range(size)], dtype=torch.long)
            for requests in similar_lengths(group, len(past)):
                tails = [r.prompt_token_ids[len(past) :] for r in requests]
                with self.lora.rows([r.adapter for r in requests]):
                    logits = self.pool.prefill(past, tails, [r.choices[0].start for r in requests], self._pad_id)
                for row, request in enumerate(requests):
                    request.num_cached_tokens = len(past)
                    self._start(request, logits[row])

    def _start(self, request: Request, logits: torch.Tensor) -> None:
        ids, params = request.prompt_token_ids, request.params
        first = request.choices[0]
        for choice in request.choices:
            if choice is not first:  # n choices: one prefill, the prompt's KV copied to each segment
                self.pool.copy(first.start, choice.start, len(ids))
            choice.length = len(ids)
            if params.presence_penalty or params.frequency_penalty:
                choice.counts = torch.zeros(logits.shape[-1])
        if self.prefix_cache is not None:
            self.prefix_cache.insert(ids, first.start, salt=request.cache_salt)
            self._note_peak()
        self._running.append(request)
        rows = [(request, choice) for choice in request.choices]
        self._accept(rows, logits.unsqueeze(0).expand(params.n, -1))

    def _decode(self) -> None:
        rows = [(r, c) for r in self._running for c in r.choices if c.finish_reason is None]
        with self.lora.rows([r.adapter for r, _ in rows]):
            logits = self.pool.decode(
                [c.start for _, c in rows], [c.length for _, c in rows], [c.token_ids[-1] for _, c in rows]
            )
        for _, choice in rows:
            choice.length += 1
        self._accept(rows, logits)

    def _accept(self, rows: list[tuple[Request, Choice]], logits: torch.Tensor) -> None:
        picks = pick_tokens(
            logits,
            [r.params for r, _ in rows],
            [c.generator for _, c in rows],
            [c.counts for _, c in rows],
            [c.grammar for _, c in rows],
        )
        touched: dict[str, Request] = {}
        for (request, choice), pick in zip(rows, picks, strict=True):
            touched[request.request_id] = request
            append_token(request, choice, pick, self.tokenizer, self.eos_token_ids)
        for request in touched.values():
            if all(c.finish_reason is not None for c in request.choices):
                self._finish(request, abort=False)
            else:
                self._notify(request)

    def _finish(self, request: Request, *, abort: bool) -> None:
        if request.finished:
            return
        admitted = request.choices[0].start >= 0
        for choice in request.choices:
            if choice.finish_reason is None:
                choice.finish_reason = "abort"
            if choice.start >= 0:  # its pool segment is free for the next admission at once
                self.pool.release(choice.start, len(request.prompt_token_ids) + request.params.max_tokens)
                choice.start = -1
        if admitted:
            self.reserved_tokens -= request.reserved_tokens
        if request in self._running:
            self._running.remove(request)
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


def _collect(done: list[Request]) -> Callable[[Request], None]:
    def on_update(request: Request) -> None:
        if request.finished:
            done.append(request)

    return on_update
