"""Engine results → OpenAI's ``chat.completion`` and ``text_completion`` objects, as OpenAI's published
schemas (CreateChatCompletionResponse, CreateCompletionResponse) define them. Pure: the caller passes the
id, the time and the fingerprint.

- Fields the spec types without null are omitted when there is no value, never null: ``system_fingerprint``
  is ``type: string``, so it is a string or absent. ``service_tier`` is "default" on chat (the tier a batch
  runs at; the completions schema has no such field).
- Ids are ``chatcmpl-``/``cmpl-`` + the output line's request id (batches.records.request_id(batch, line)):
  a line regenerated after a crash or retry gets the same id, so a consumer deduplicating on it sees one
  completion, and the id ties the body to its output line.
- A chat choice whose text holds tool calls (tool_format.tool_answer) is written as OpenAI writes one: the calls
  in ``message.tool_calls`` (ids from the completion's id, tools.call_id), the text around them as ``content``
  (null when none) and ``finish_reason`` "tool_calls".
- A logprob the engine reports as -inf (a token that could not be sampled) is written as -9999.0, OpenAI's
  floor for it: JSON has no infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.kinds.generation.bodies import GenerationRequest
from controlplane.kinds.generation.tool_format import tool_answer
from controlplane.kinds.generation.tools import call_id

__all__ = [
    "EngineChoice",
    "EngineResult",
    "TokenLogprob",
    "TopLogprob",
    "completion_id",
    "render_chat_completion",
    "render_completion",
    "render_text_completion",
]

LOGPROB_FLOOR = -9999.0
_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    # The token's bytes when its text alone does not say (a byte-level BPE piece of a multi-byte character).
    token_bytes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[TopLogprob, ...] = ()  # the most likely alternatives at this position, best first
    token_bytes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class EngineChoice:
    text: str  # already cut at a stop string, which is not included (OpenAI's behaviour)
    finish_reason: Literal["stop", "length"]
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per generated token, when the request asked


@dataclass(frozen=True)
class EngineResult:
    choices: tuple[EngineChoice, ...]  # in index order, one per requested choice
    prompt_tokens: int  # as the engine counted them (once, whatever n)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def completion_tokens(self) -> int:
        return sum(choice.completion_tokens for choice in self.choices)


def completion_id(kind: Literal["chat", "completion"], request_id: str) -> str:
    """The body's id from the output line's request id (batches.records.request_id)."""
    return _ID_PREFIX[kind] + request_id


def render_completion(
    request: GenerationRequest,
    result: EngineResult,
    *,
    request_id: str,
    created: int,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """The response body for ``request``'s endpoint."""
    render = render_chat_completion if request.kind == "chat" else render_text_completion
    return render(
        request, result, completion_id=completion_id(request.kind, request_id), created=created,
        system_fingerprint=system_fingerprint,
    )  # fmt: skip


def render_chat_completion(
    request: GenerationRequest,
    result: EngineResult,
    *,
    completion_id: str,
    created: int,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    choices = [_chat_choice(request, choice, index, completion_id) for index, choice in enumerate(result.choices)]
    body = _envelope("chat.completion", request, result, completion_id, created, system_fingerprint, choices)
    body["service_tier"] = "default"
    return body


def _chat_choice(request: GenerationRequest, choice: EngineChoice, index: int, completion_id: str) -> dict[str, Any]:
    content, calls = tool_answer(choice.text, request.tools, request.tool_choice, parallel=request.parallel_tool_calls)
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None, "annotations": []}
    if calls:
        message["tool_calls"] = [
            {
                "id": call_id(completion_id, index, position),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for position, call in enumerate(calls)
        ]
    return {
        "index": index,
        "message": message,
        "logprobs": _chat_logprobs(request, choice),
        "finish_reason": "tool_calls" if calls else choice.finish_reason,
    }


def render_text_completion(
    request: GenerationRequest,
    result: EngineResult,
    *,
    completion_id: str,
    created: int,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    choices = [
        {
            "text": choice.text,
            "index": index,
            "logprobs": _legacy_logprobs(request, choice),
            "finish_reason": choice.finish_reason,
        }
        for index, choice in enumerate(result.choices)
    ]
    return _envelope("text_completion", request, result, completion_id, created, system_fingerprint, choices)


def _envelope(
    kind: str,
    request: GenerationRequest,
    result: EngineResult,
    completion_id: str,
    created: int,
    system_fingerprint: str | None,
    choices: list[dict[str, Any]],
) -> dict[str, Any]:
    _check(request, result)
    body: dict[str, Any] = {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": request.model,
        "choices": choices,
        "usage": _usage(result),
    }
    if system_fingerprint is not None:
        body["system_fingerprint"] = system_fingerprint
    return body


def _check(request: GenerationRequest, result: EngineResult) -> None:
    """An engine answer that cannot be this request's is a bug upstream: refuse to write it as a success."""
    if len(result.choices) != request.n:
        raise ValueError(f"the engine returned {len(result.choices)} choices for n={request.n}")
    if not 0 <= result.cached_tokens <= result.prompt_tokens:
        raise ValueError(f"cached_tokens {result.cached_tokens} is outside 0..prompt_tokens {result.prompt_tokens}")
    for choice in result.choices:
        if not 0 <= choice.completion_tokens <= request.max_tokens:
            raise ValueError(f"{choice.completion_tokens} completion tokens for max_tokens={request.max_tokens}")
        if request.logprobs and choice.logprobs is None:
            raise ValueError("the request asked for logprobs and the engine returned none")


def _usage(result: EngineResult) -> dict[str, Any]:
    # OpenAI writes every detail field, zero when unused; the SDK's types expect them.
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _logprob(value: float) -> float:
    return value if math.isfinite(value) else LOGPROB_FLOOR


def _bytes(token: str, given: tuple[int, ...] | None) -> list[int]:
    return list(given) if given is not None else list(token.encode("utf-8"))


def _chat_logprobs(request: GenerationRequest, choice: EngineChoice) -> dict[str, Any] | None:
    if not request.logprobs or choice.logprobs is None:
        return None
    return {
        "content": [
            {
                "token": entry.token,
                "logprob": _logprob(entry.logprob),
                "bytes": _bytes(entry.token, entry.token_bytes),
                "top_logprobs": [
                    {"token": alt.token, "logprob": _logprob(alt.logprob), "bytes": _bytes(alt.token, alt.token_bytes)}
                    for alt in entry.top[: request.top_logprobs]
                ],
            }
            for entry in choice.logprobs
        ],
        "refusal": None,
    }


def _legacy_logprobs(request: GenerationRequest, choice: EngineChoice) -> dict[str, Any] | None:
    """Completions' shape: parallel lists. ``text_offset`` is each token's character offset in the choice's
    ``text`` (no echo here, so the prompt is not part of it)."""
    if not request.logprobs or choice.logprobs is None:
        return None
    offsets, position = [], 0
    for entry in choice.logprobs:
        offsets.append(position)
        position += len(entry.token)
    return {
        "tokens": [entry.token for entry in choice.logprobs],
        "token_logprobs": [_logprob(entry.logprob) for entry in choice.logprobs],
        "top_logprobs": [
            {alt.token: _logprob(alt.logprob) for alt in entry.top[: request.top_logprobs]} for entry in choice.logprobs
        ],
        "text_offset": offsets,
    }
