"""Tools in the model's text: how the tool list and a history with calls reach the prompt, and how the calls are
read back out of what the model wrote.

Into the prompt, as transformers' ``apply_chat_template(messages, tools=...)`` does: a chat template that takes
``tools`` (it names the variable) gets them, and the history in transformers' convention (messages.py). A template
that does not know tools (SmolLM2's, tinylm's) gets the Hermes format (Hermes 2 Pro, Qwen 2.5), written compactly
so that it fits a small context:

- the tool list in the system message (appended to the first system message after a blank line, else a system
  message of its own first)::

      You may call these functions:
      <tools>
      {"name":"get_weather","description":"...","parameters":{...}}
      </tools>
      To call one, answer <tool_call>{"name":<name>,"arguments":<arguments object>}</tool_call>

- an assistant message's calls as ``<tool_call>{"name":...,"arguments":{...}}</tool_call>``, one per call after
  its text;
- tool messages as a user turn of ``<tool_response>...</tool_response>`` blocks (consecutive ones in one turn).

Out of the text, for ``tool_choice`` "auto" (a forced choice's text is the call's JSON itself, tools.py): the parser
named for the model (``TOOL_CALL_PARSERS``; every model uses "hermes" today) finds ``<tool_call>{...}</tool_call>``
blocks (the last one may lack its closing tag: the model may stop on EOS instead). When every block is a call of a
listed function whose arguments validate against its parameters, they are the answer's calls and the text outside
them (stripped) its content, null when empty; otherwise nothing was called and the whole text is the content.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from typing import Any

from controlplane.kinds.generation.tools import FunctionTool, ToolCall, ToolChoice, checked_call, forced_call

__all__ = [
    "DEFAULT_TOOL_CALL_PARSER",
    "TOOL_CALL_PARSERS",
    "hermes_conversation",
    "template_takes_tools",
    "tool_answer",
]

TOOLS_INTRO = "You may call these functions:"
TOOLS_INSTRUCTION = 'To call one, answer <tool_call>{"name":<name>,"arguments":<arguments object>}</tool_call>'
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)


def template_takes_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads a ``tools`` variable (so it renders tools its own way)."""
    source = getattr(tokenizer, "chat_template", None)
    return isinstance(source, str) and _names_tools(source)


@functools.lru_cache(maxsize=32)
def _names_tools(source: str) -> bool:
    from jinja2 import Environment, TemplateSyntaxError, meta

    try:
        parsed = Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except TemplateSyntaxError:
        return False  # a template that does not compile fails at rendering, with its own error
    return "tools" in meta.find_undeclared_variables(parsed)


def hermes_conversation(conversation: list[dict[str, Any]], tools: tuple[FunctionTool, ...]) -> list[dict[str, Any]]:
    """The conversation for a template that does not know tools: the tool list and the calls in the history as
    Hermes text, in plain system/user/assistant messages. Without tools or calls, the conversation unchanged."""
    if not tools and not any(m["role"] == "tool" or "tool_calls" in m for m in conversation):
        return conversation
    rendered: list[dict[str, Any]] = []
    after_tool = False  # consecutive tool messages share one user turn
    for message in conversation:
        if message["role"] == "tool":
            response = f"<tool_response>\n{message['content']}\n</tool_response>"
            if after_tool:
                rendered[-1]["content"] += "\n" + response
            else:
                rendered.append({"role": "user", "content": response})
            after_tool = True
            continue
        after_tool = False
        plain = {key: value for key, value in message.items() if key != "tool_calls"}
        if "tool_calls" in message:
            calls = [
                _call_text(call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]
            ]
            plain["content"] = "\n".join([message["content"], *calls] if message["content"] else calls)
        rendered.append(plain)
    if tools:
        block = tools_block(tools)
        if rendered[0]["role"] == "system":
            rendered[0] = {**rendered[0], "content": f"{rendered[0]['content']}\n\n{block}"}
        else:
            rendered.insert(0, {"role": "system", "content": block})
    return rendered


def tools_block(tools: tuple[FunctionTool, ...]) -> str:
    functions = "\n".join(_compact(tool.for_template()["function"]) for tool in tools)
    return f"{TOOLS_INTRO}\n<tools>\n{functions}\n</tools>\n{TOOLS_INSTRUCTION}"


def _call_text(name: str, arguments: Any) -> str:
    return f"<tool_call>{_compact({'name': name, 'arguments': arguments})}</tool_call>"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def hermes_calls(text: str, tools: tuple[FunctionTool, ...]) -> tuple[str | None, tuple[ToolCall, ...]] | None:
    """(the content outside the calls or None, the calls) when the text holds calls that all check out; else None."""
    calls = []
    for match in _BLOCK.finditer(text):
        try:
            value = json.loads(match.group(1) if match.group(1) is not None else match.group(2))
        except (ValueError, RecursionError):  # the model's text: anything, nested past the parser's depth too
            return None
        call = checked_call(value, tools)
        if call is None:
            return None
        calls.append(call)
    if not calls:
        return None
    content = _BLOCK.sub("", text).strip()
    return content or None, tuple(calls)


ToolCallParser = Callable[[str, tuple[FunctionTool, ...]], "tuple[str | None, tuple[ToolCall, ...]] | None"]
TOOL_CALL_PARSERS: dict[str, ToolCallParser] = {"hermes": hermes_calls}
DEFAULT_TOOL_CALL_PARSER = "hermes"


def tool_answer(
    text: str, tools: tuple[FunctionTool, ...], choice: ToolChoice, *, parallel: bool
) -> tuple[str | None, tuple[ToolCall, ...]]:
    """A choice's text → (its content, its calls). A forced choice's text is the call's JSON (its grammar); a cut
    one (max_tokens) is left as content. "auto" reads the text with the model's parser; "none" calls nothing."""
    if choice.forced:
        call = forced_call(text, tools)
        return (None, (call,)) if call is not None else (text, ())
    if choice.mode == "auto":
        found = TOOL_CALL_PARSERS[DEFAULT_TOOL_CALL_PARSER](text, tools)
        if found is not None:
            content, calls = found
            return content, calls if parallel else calls[:1]
    return text, ()
