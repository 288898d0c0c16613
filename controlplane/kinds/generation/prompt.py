"""A chat's prompt: the conversation (messages.py) and the tools through the model's chat template, as the text
the engine tokenizes (bodies.py's decisions: a BOS the tokenizer adds itself is taken off the template's text)."""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any, Protocol, cast

from jinja2 import TemplateError

from controlplane.kinds.generation.fields import BodyError
from controlplane.kinds.generation.tool_format import hermes_conversation, template_takes_tools
from controlplane.kinds.generation.tools import FunctionTool

__all__ = ["ChatTokenizer", "chat_prompt"]


class ChatTokenizer(Protocol):
    """The part of a Hugging Face tokenizer this module uses (positional-only: any argument name fits). ``tools``
    is passed only to a template that reads it (tool_format.template_takes_tools)."""

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        /,
        *,
        add_generation_prompt: bool,
        tokenize: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> Any: ...

    def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]: ...


def chat_prompt(tokenizer: ChatTokenizer, conversation: list[dict[str, Any]], tools: tuple[FunctionTool, ...]) -> str:
    """The text the engine gets for a chat: the template's, with tools as the template takes them where it reads
    ``tools``, else in the Hermes format (tool_format.py); less a BOS the tokenizer adds itself."""
    try:
        if template_takes_tools(tokenizer) and tools:
            listed = [tool.for_template() for tool in tools]
            text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False, tools=listed)
        else:
            conversation = conversation if template_takes_tools(tokenizer) else hermes_conversation(conversation, tools)
            text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    except TemplateError as exc:  # templates raise on purpose for conversations they refuse (role order)
        raise BodyError("messages", "invalid_value", f"The model's chat template refused the messages: {exc}") from exc
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not text")
    return _without_added_bos(tokenizer, text)


def _without_added_bos(tokenizer: ChatTokenizer, text: str) -> str:
    """The template's text less a leading BOS that the tokenizer adds by itself when it encodes."""
    bos = _added_bos(cast(Hashable, tokenizer))  # tokenizers hash by identity
    return text[len(bos) :] if bos and text.startswith(bos) else text


@functools.lru_cache(maxsize=32)
def _added_bos(tokenizer: Any) -> str | None:
    """The BOS text a tokenizer puts in front of what it encodes with special tokens (Llama 2/3), else None;
    asked once per tokenizer, not per line (validation parses every line of a batch)."""
    bos = getattr(tokenizer, "bos_token", None)
    if not isinstance(bos, str) or not bos:
        return None
    added = tokenizer.encode("", add_special_tokens=True)
    return bos if added[:1] == tokenizer.encode(bos, add_special_tokens=False) else None
