"""A parsed generation line ↔ the engine's wire (Triton's vLLM-backend interface, triton/streaming.py): the
request it is sent as, and the ``EngineResult`` its final response becomes (what render.py renders).

- The engine gets the prompt as text (chat templates were applied by the parser) with
  ``exclude_input_in_output`` (streaming.py always sets it): a completion's text is what was generated. An
  engine whose catalogue entry declares ``prompt_token_ids`` (tinylm's) gets the ids validation counted too,
  and skips its own tokenizer; the catalogue's ``tokenizer_dir`` must then be the engine's tokenizer.
- One Triton request per line, ``n`` in its sampling parameters: the engine answers one element per choice.
- Constrained decoding as ``guided_decoding`` (schema.py): response_format's schema, or for a line whose
  ``tool_choice`` forces a call the call's schema (tools.tool_call_schema), which takes its place: a forced answer
  is a call, not content for response_format to shape.
- A line naming a LoRA adapter (``body.model`` ``base:adapter``, resolved at intake) runs with it: the adapter's
  name goes as ``lora_name`` in the sampling parameters, where Triton's vLLM backend reads it (src/model.py,
  ``_verify_loras``; the key is not vLLM's SamplingParams', the backend pops it); a base line has no such key.
- Logprobs arrive as vLLM's JSON, per choice a list with one entry per generated token,
  ``{token_id: {logprob, rank, decoded_token}}``, the sampled token first (vLLM builds the entry from the
  sampled id, then the top-k; tinylm's cb_sampling does the same), so the first key is the token and the
  entries ranked within ``top_logprobs`` are its alternatives.
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.fleet.models import CatalogueModel, split_model_name
from controlplane.kinds.generation.bodies import GenerationRequest
from controlplane.kinds.generation.render import EngineChoice, EngineResult, TokenLogprob, TopLogprob
from controlplane.kinds.generation.schema import structured_outputs
from controlplane.kinds.generation.tools import tool_call_schema
from controlplane.triton.streaming import GenerationRequest as StreamRequest
from controlplane.triton.streaming import GenerationResponse

__all__ = ["EngineAnswerError", "engine_request", "engine_result"]

_BASE_OUTPUTS = ("finish_reason", "num_input_tokens", "num_output_tokens")
_FINISH_REASONS = ("stop", "length")


class EngineAnswerError(Exception):
    """The engine's final answer for a line cannot be rendered (a finish reason other than stop/length, e.g.
    vLLM's "abort"; a missing count): that line is answered with a server error, the others run on."""


def engine_request(request_id: str, request: GenerationRequest, *, model: CatalogueModel) -> StreamRequest:
    sampling: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "n": request.n,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
    }
    if request.seed is not None:
        sampling["seed"] = request.seed
    if request.stop:
        sampling["stop"] = list(request.stop)
    guided = structured_outputs(request.response_format)
    call_schema = tool_call_schema(request.tools, request.tool_choice)
    if call_schema is not None:  # a forced call: its grammar, in place of response_format (which shapes content)
        guided = json.dumps({"json": call_schema})
    if guided is not None:  # parse_body let it through only for a model whose engine constrains decoding
        sampling["guided_decoding"] = guided
    outputs: tuple[str, ...] = _BASE_OUTPUTS
    if request.logprobs:
        sampling["logprobs"] = request.top_logprobs  # vLLM: top-k per token, plus the sampled one; 0 = only it
        outputs += ("logprobs",)
    if _declares(model, "return_num_cached_tokens"):
        outputs += ("num_cached_tokens",)
    # Only adapter lines carry the key: a base line reaches an engine without LoRA support unchanged (vLLM's
    # backend refuses lora_name when its model.json does not enable LoRA).
    _, adapter = split_model_name(request.model)
    if adapter:
        sampling["lora_name"] = adapter
    # An engine that takes the prompt's token ids (tinylm's) gets validation's: it would only tokenize the same
    # text again, under the GIL its step loop needs (bodies.py: the ids are the engine's encoding of the text).
    ids = request.prompt_token_ids if _declares(model, "prompt_token_ids") else None
    return StreamRequest(request_id, request.prompt_text, sampling, outputs=outputs, prompt_token_ids=ids)


def _declares(model: CatalogueModel, input_name: str) -> bool:
    """Whether the Triton model takes an optional input: asking a model without it is an error (vLLM's
    backend refuses unknown inputs), so extras are only asked of models whose catalogue entry lists them."""
    return any(isinstance(spec, dict) and spec.get("name") == input_name for spec in model.inputs or ())


def engine_result(request: GenerationRequest, response: GenerationResponse) -> EngineResult:
    """The final response of a line → its EngineResult; raises EngineAnswerError for an answer that is not a
    completion of this request."""
    if len(response.texts) != request.n:
        raise EngineAnswerError(f"the engine returned {len(response.texts)} choices for n={request.n}")
    reasons = response.finish_reasons or [None] * request.n
    counts = response.num_output_tokens
    if counts is None or len(counts) != request.n:
        raise EngineAnswerError("the engine did not report each choice's output tokens")
    choices = []
    for index, text in enumerate(response.texts):
        reason = reasons[index] if index < len(reasons) else None
        if reason not in _FINISH_REASONS:
            raise EngineAnswerError(f"the engine ended choice {index} with finish_reason {reason!r}")
        logprobs = None
        if request.logprobs:
            entries = response.logprobs[index] if response.logprobs and index < len(response.logprobs) else None
            if entries is None:
                raise EngineAnswerError("the request asked for logprobs and the engine returned none")
            logprobs = tuple(_token_logprob(entry, request.top_logprobs) for entry in entries)
        choices.append(
            EngineChoice(
                text=text,
                finish_reason=reason,  # type: ignore[arg-type]  # one of _FINISH_REASONS, checked above
                completion_tokens=int(counts[index]),
                logprobs=logprobs,
            )
        )
    # The engine's own prompt count when it gives one (it tokenized what it ran); else the parser's.
    prompt_tokens = response.num_input_tokens if response.num_input_tokens is not None else request.prompt_tokens
    cached = min(response.num_cached_tokens or 0, prompt_tokens)
    return EngineResult(choices=tuple(choices), prompt_tokens=prompt_tokens, cached_tokens=cached)


def _token_logprob(entry: dict[str, Any], top_k: int) -> TokenLogprob:
    """One position of vLLM's logprobs: the sampled token (first key) and the ``top_k`` best, best first."""
    if not entry:
        raise EngineAnswerError("an empty logprobs entry")
    ranked = [
        (info.get("rank") or 0, str(info.get("decoded_token") or ""), float(info["logprob"])) for info in entry.values()
    ]
    _, token, logprob = ranked[0]
    top = sorted((r for r in ranked if 1 <= r[0] <= top_k), key=lambda r: r[0])
    return TokenLogprob(token=token, logprob=logprob, top=tuple(TopLogprob(t, lp) for _, t, lp in top))
