"""An engine result → OpenAI's ``response`` object (the Responses API's Response), as its published schema
defines it. Pure, as render.py: the caller passes the id and the time.

The chat completion is rendered first (render.render_chat_completion, with its checks of the engine's answer)
and translated: its one choice becomes an assistant ``message`` output item (its text) and a ``function_call``
item per tool call (``call_id`` the chat call's id, the item's id ``fc_`` + the same digest), its usage the
Response's. A choice that is only calls has no message item, as OpenAI answers.

- ``status`` is "completed", or "incomplete" with ``incomplete_details.reason`` "max_output_tokens" when the
  line stopped at its token limit (the choice's finish_reason "length"); the output message is "incomplete"
  then too, as OpenAI writes it.
- Ids are ``resp_``/``msg_`` + the output line's request id, stable across retries as render.py's are.
- ``output_text`` is not written: it is a convenience property of OpenAI's SDKs, computed from ``output``,
  not a field of the wire object.
- The echo fields (``user`` only when the line set it: the spec types it a string, not null) repeat the request (instructions, max_output_tokens as requested, sampling, text format,
  tool settings, metadata), with OpenAI's defaults where the line left them out.
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.kinds.generation.bodies import GenerationRequest
from controlplane.kinds.generation.fields import ResponseFormat
from controlplane.kinds.generation.render import EngineResult, render_chat_completion
from controlplane.kinds.generation.responses import ResponseEcho, ResponsesRequest
from controlplane.kinds.generation.tools import FunctionTool

__all__ = ["render_response"]


def render_response(
    request: GenerationRequest, result: EngineResult, *, request_id: str, created: int
) -> dict[str, Any]:
    """The response body of a ``/v1/responses`` line (``request`` a ResponsesRequest; a plain GenerationRequest
    renders with the default echo)."""
    if request.n != 1:
        raise ValueError(f"a responses line has one output, not n={request.n}")
    echo = request.echo if isinstance(request, ResponsesRequest) else ResponseEcho()
    chat = render_chat_completion(request, result, completion_id=request_id, created=created)
    [choice] = chat["choices"]
    complete = choice["finish_reason"] != "length"
    status = "completed" if complete else "incomplete"
    text, calls = choice["message"]["content"], choice["message"].get("tool_calls", ())
    output: list[dict[str, Any]] = []
    if text or not calls:  # a call alone is the whole answer; text (even empty) otherwise
        logprobs = choice["logprobs"]["content"] if choice["logprobs"] is not None else []
        content = [{"type": "output_text", "text": text or "", "annotations": [], "logprobs": logprobs}]
        output.append(
            {"id": f"msg_{request_id}", "type": "message", "status": status, "role": "assistant", "content": content}
        )
    output.extend(
        {
            "id": f"fc_{call['id'].removeprefix('call_')}",
            "type": "function_call",
            "status": "completed",
            "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
        for call in calls
    )
    usage = chat["usage"]
    body: dict[str, Any] = {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": created,
        "status": status,
        "completed_at": created if complete else None,
        "error": None,
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "temperature": request.temperature,
        "text": {"format": _format(request.response_format, echo.format_description)},
        "tool_choice": _tool_choice(request) if request.tools else echo.tool_choice,
        "tools": [_tool(tool) for tool in request.tools],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "cache_write_tokens": 0,
            },
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "safety_identifier": echo.safety_identifier,
        "prompt_cache_key": echo.prompt_cache_key,
        "background": False,
        "max_tool_calls": None,
        "top_logprobs": echo.top_logprobs,
        "metadata": dict(request.metadata or ()),
    }
    if request.user is not None:  # a string in the spec, never null
        body["user"] = request.user
    return body


def _format(response_format: ResponseFormat, description: str | None) -> dict[str, Any]:
    if response_format.type != "json_schema":
        return {"type": response_format.type}
    spec: dict[str, Any] = {
        "type": "json_schema",
        "name": response_format.name,
        "schema": json.loads(response_format.schema or "{}"),
        "strict": response_format.strict,
    }
    if description is not None:
        spec["description"] = description
    return spec


def _tool(tool: FunctionTool) -> dict[str, Any]:
    parameters = json.loads(tool.parameters) if tool.parameters is not None else None
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": parameters,
        "strict": tool.strict,
    }


def _tool_choice(request: GenerationRequest) -> str | dict[str, Any]:
    choice = request.tool_choice
    return {"type": "function", "name": choice.function} if choice.mode == "function" else choice.mode
