"""What a generation line costs, in tokens, for the scheduler (DESIGN.md, "Generation batches"):

- quota: the enqueued-token quota counts prompt + n · max_tokens, the most a line can generate, so the output a
  tenant may have queued (and will be billed for) is bounded by the quota too, not only its prompts (OpenAI's rule);
- reservation: a dispatch reserves prompt + max_tokens per sequence against the instance's KV budget (TGI's and
  TRT-LLM guaranteed_no_evict's budget), n sequences per line. Engines that share the prompt's cache blocks
  between the n choices use less; the reservation is an upper bound, so it never over-commits;
- fair share: (prompt - cached) + w · completion, with w the catalogue's decode weight (a decode step costs
  more per token than prefill). Before a line runs, its completion is estimated: max_tokens per choice unless
  the caller has a measured mean completion length for the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.kinds.generation.bodies import GenerationRequest
from controlplane.kinds.generation.render import EngineResult

__all__ = [
    "GenerationLine",
    "estimated_charge",
    "fair_share_charge",
    "line_output_bytes",
    "line_prompt_tokens",
    "line_quota_tokens",
    "line_reservation",
    "result_charge",
]


@dataclass(frozen=True)
class GenerationLine:
    """A parsed generation line: the request, and its work units as estimated for its model."""

    request: GenerationRequest
    units: int
    # The expected bytes of its output beyond the line's envelope (line_output_bytes), for validation's storage
    # reservation only: shard columns do not keep it (a run has no use for it), so it is not part of the line's
    # identity either.
    output_bytes: int = field(default=0, compare=False)


# Output bytes beyond the envelope every kind counts (kinds/base.OUTPUT_LINE_BYTES), as render.py writes them
# (tests/kinds/test_generation_units.py holds the estimate above the rendered body and within 3× of it): a body's
# own fields (object, created, model, usage and its details) and each choice's (index, message, finish_reason);
# a generated token's share of the text (~4 characters; escapes and multi-byte characters take more); with
# logprobs, the token's entry ({"token": " the", "logprob": -0.0123, "bytes": [...], "top_logprobs": []}) and
# each alternative's.
BODY_BYTES = 200
CHOICE_BYTES = 160
TEXT_BYTES_PER_TOKEN = 8
LOGPROB_ENTRY_BYTES = 100
TOP_LOGPROB_BYTES = 80


def line_output_bytes(request: GenerationRequest, *, expected_completion_tokens: float | None) -> int:
    """The expected bytes of a line's output beyond its envelope: n choices of the expected completion (the
    model's measured mean, capped at max_tokens; max_tokens until measured), each token with its logprob entry
    and top_logprobs alternatives when asked for. With top_logprobs 20 a line writes ~200× the bytes of the same
    line without logprobs: a figure per work unit would undercount it by that much."""
    expected = request.max_tokens
    if expected_completion_tokens is not None:
        expected = min(expected, max(1, round(expected_completion_tokens)))
    per_token = TEXT_BYTES_PER_TOKEN
    if request.logprobs:
        per_token += LOGPROB_ENTRY_BYTES + request.top_logprobs * TOP_LOGPROB_BYTES
    return BODY_BYTES + request.n * (CHOICE_BYTES + expected * per_token)


def line_prompt_tokens(request: GenerationRequest) -> int:
    """The line's prompt tokens, once, whatever n."""
    return request.prompt_tokens


def line_quota_tokens(request: GenerationRequest) -> int:
    """Tokens the enqueued-token quota counts for the line: its prompt and every token its n choices may generate."""
    return request.prompt_tokens + request.n * request.max_tokens


def line_reservation(request: GenerationRequest) -> int:
    """KV-cache tokens a dispatch reserves for the line: n sequences of prompt + max_tokens."""
    return request.n * (request.prompt_tokens + request.max_tokens)


def fair_share_charge(
    *, prompt_tokens: int, cached_tokens: int, completion_tokens: int, completion_weight: float
) -> float:
    """(prompt - cached) + w · completion."""
    if not 0 <= cached_tokens <= prompt_tokens or completion_tokens < 0 or completion_weight < 0:
        raise ValueError("token counts and the weight must be non-negative, cached within the prompt")
    return (prompt_tokens - cached_tokens) + completion_weight * completion_tokens


def estimated_charge(
    request: GenerationRequest, *, completion_weight: float, expected_completion_tokens: float | None = None
) -> float:
    """The charge before the line runs: nothing assumed cached, each choice generating its expected length
    (max_tokens at first; a measured mean for the model once known, never above max_tokens)."""
    per_choice = request.max_tokens
    if expected_completion_tokens is not None:
        per_choice = min(request.max_tokens, max(0, round(expected_completion_tokens)))
    return fair_share_charge(
        prompt_tokens=request.prompt_tokens,
        cached_tokens=0,
        completion_tokens=request.n * per_choice,
        completion_weight=completion_weight,
    )


def result_charge(result: EngineResult, *, completion_weight: float) -> float:
    """The charge once the line ran, from what the engine reports."""
    return fair_share_charge(
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        completion_tokens=result.completion_tokens,
        completion_weight=completion_weight,
    )
