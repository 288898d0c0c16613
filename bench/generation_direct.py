"""The served engine without the control plane: a corpus sent straight to tritonserver on one generation stream
(controlplane/triton/streaming.py, as a shard sends it: every line in flight up to 2 × max_num_seqs, the prompt's
text and its token ids, greedy), timed from the first request to the last final response. Beside the engine in
process and the batch end to end, it splits the gap between them: the Triton stub's share, the control plane's."""

from __future__ import annotations

import queue
import time
from collections.abc import Sequence

from controlplane.triton.streaming import GenerationRequest, GenerationResponse, GenerationStream


def direct_tokens_per_s(
    url: str,
    model: str,
    prompts: Sequence[str],
    token_ids: Sequence[Sequence[int]],
    max_tokens: Sequence[int],
    *,
    inflight: int,
) -> tuple[float, int]:
    """(completion tokens per second, completion tokens) of the corpus on the server at ``url``."""
    inbox: queue.Queue[GenerationResponse] = queue.Queue()
    stream = GenerationStream(url, model, on_response=inbox.put)
    tokens, waiting, running = 0, list(range(len(prompts)))[::-1], 0
    try:
        started = time.perf_counter()
        while waiting or running:
            while waiting and running < inflight:
                i = waiting.pop()
                sampling = {"max_tokens": max_tokens[i], "temperature": 0.0}
                stream.submit(GenerationRequest(str(i), prompts[i], sampling, prompt_token_ids=tuple(token_ids[i])))
                running += 1
            response = inbox.get(timeout=120)
            if response.error is not None:
                raise RuntimeError(f"request {response.request_id}: {response.error}")
            if response.final:
                running -= 1
            tokens += sum(response.num_output_tokens or ())
        seconds = time.perf_counter() - started
    finally:
        stream.close()
    return tokens / seconds, tokens
