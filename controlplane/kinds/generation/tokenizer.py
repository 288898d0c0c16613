"""A generation model's tokenizer read straight from its directory: ``tokenizer.json`` through the `tokenizers`
library (Rust) and the chat template through Jinja2 set up as Hugging Face's ``apply_chat_template`` sets it up.

Why not transformers' ``AutoTokenizer`` everywhere: importing transformers imports torch, ~3.6 s of CPU on a
quiet 2-core host (more under load) and ~300 MB in every process that loads a tokenizer, and every prefork
child of a shard worker preloads the enabled models' tokenizers (controlplane/celery.py). Read from the files,
the same tokenizer loads in ~0.05 s. tests/kinds/test_generation_tokenizer.py holds it to AutoTokenizer's
prompts and token ids.

Only directories whose tokenizer AutoTokenizer would load as a plain fast tokenizer are read here
(``tokenizer_class`` TokenizersBackend / PreTrainedTokenizerFast, one chat template, no ``add_bos_token`` /
``add_eos_token`` overrides, which transformers applies to the post-processor at load, special tokens written
as text, no ``{% generation %}`` blocks); ``file_tokenizer`` returns None for any other, and the caller loads AutoTokenizer.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

# The classes AutoTokenizer maps to a tokenizer.json wrapped as it is (transformers 5's TokenizersBackend,
# PreTrainedTokenizerFast before it): a model's own class (LlamaTokenizerFast, …) may rewrite it at load.
_PLAIN_CLASSES = frozenset({"TokenizersBackend", "PreTrainedTokenizerFast"})
# tokenizer_config.json keys that make transformers change the loaded tokenizer (its post-processor).
_LOAD_TIME_OVERRIDES = ("add_bos_token", "add_eos_token")
# The special tokens a template sees by name (transformers' SPECIAL_TOKENS_ATTRIBUTES, without the lists).
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_GENERATION_BLOCK = re.compile(r"\{%-?\s*generation\s*-?%\}")


class FileTokenizer:
    """The ChatTokenizer protocol (kinds/generation/bodies.py) over a tokenizer.json and a chat template."""

    def __init__(self, tokenizer: Any, chat_template: Any, special_tokens: dict[str, str], source: str = "") -> None:
        self._tokenizer = tokenizer
        self._template = chat_template  # compiled (_compile)
        self._special_tokens = special_tokens
        self.chat_template = source  # the template's text, as transformers' tokenizers expose it

    @property
    def bos_token(self) -> str | None:
        return self._special_tokens.get("bos_token")

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        /,
        *,
        add_generation_prompt: bool,
        tokenize: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> Any:
        text = self._template.render(
            messages=[dict(message) for message in conversation],
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **self._special_tokens,
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def encode(self, text: str, /, *, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)


def file_tokenizer(path: Path) -> FileTokenizer | None:
    """The directory's tokenizer read from its files, or None where only transformers would load it the same."""
    config_path, tokenizer_path = path / "tokenizer_config.json", path / "tokenizer.json"
    if not tokenizer_path.is_file() or not config_path.is_file():
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") not in _PLAIN_CLASSES or any(key in config for key in _LOAD_TIME_OVERRIDES):
        return None
    template_file = path / "chat_template.jinja"  # transformers 5 prefers the file to the config's entry
    template = template_file.read_text(encoding="utf-8") if template_file.is_file() else config.get("chat_template")
    if not isinstance(template, str) or _GENERATION_BLOCK.search(template):
        return None
    special_tokens = {name: config[name] for name in _SPECIAL_TOKENS if config.get(name)}
    if not all(isinstance(token, str) for token in special_tokens.values()):
        return None  # an AddedToken written as a dict: transformers' own rules decide what it means

    from tokenizers import Tokenizer

    try:  # a file tokenizers cannot read (it raises plain Exception), a template Jinja cannot compile
        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        compiled = _compile(template)
    except Exception:  # noqa: BLE001 - transformers loads it and reports what is wrong, as before
        return None
    tokenizer.no_truncation()  # transformers turns both off unless a call asks for them
    tokenizer.no_padding()
    return FileTokenizer(tokenizer, compiled, special_tokens, template)


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # As transformers' override: Jinja's own tojson escapes HTML characters, which would change prompts.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _compile(chat_template: str) -> Any:
    """The environment transformers renders chat templates in: sandboxed, blocks trimmed, loop controls."""
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(chat_template)
