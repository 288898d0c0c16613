"""The tokenizer read from a model's files (controlplane/kinds/generation/tokenizer.py) against transformers'
AutoTokenizer on the same directory: the same prompt text and token ids, or no file tokenizer at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError

from controlplane.kinds.generation.tokenizer import FileTokenizer, file_tokenizer

TINYLM = Path(__file__).resolve().parents[2] / "triton_models" / "tinylm" / "1" / "hf"
pytestmark = pytest.mark.skipif(
    not (TINYLM / "tokenizer.json").is_file(), reason="tinylm is trained by `make install` (not run here yet)"
)
# A template that uses what transformers gives templates: special tokens by name, tojson without HTML escapes,
# raise_exception, loop controls, trimmed blocks.
RICH_TEMPLATE = """{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('a conversation starts with a user') }}{% endif %}
{% for message in messages %}
  {% if message['role'] == 'system' %}{{ message['content'] | tojson }}{% continue %}{% endif %}
  <|{{ message['role'] }}|> {{ message['content'] }} {{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<|assistant|>{% endif %}"""


def _auto(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.fixture(scope="module")
def tinylm_pair() -> tuple[FileTokenizer, object]:
    files = file_tokenizer(TINYLM)
    assert files is not None, "tinylm's tokenizer is plain: it must be read from its files"
    return files, _auto(TINYLM)


def _directory(tmp_path: Path, template: object = None, **config: object) -> Path:
    """tinylm's tokenizer with another chat template (in tokenizer_config.json) or config entries."""
    path = tmp_path / "tok"
    shutil.copytree(TINYLM, path, ignore=shutil.ignore_patterns("*.safetensors"))
    settings_file = path / "tokenizer_config.json"
    merged = {**json.loads(settings_file.read_text()), **config}
    if template is not None:
        (path / "chat_template.jinja").unlink()
        merged["chat_template"] = template
    settings_file.write_text(json.dumps(merged))
    return path


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40) | st.sampled_from(
    ["count from 1 to 5", "<eos> <|user|>", "  spaced  ", "\n", '{"a": "<b>&"}', "é ü 数字 🙂"]
)
_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant"]), "content": _text}),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(messages=_messages, add_generation_prompt=st.booleans())
def test_tinylm_prompts_and_ids_are_transformers_own(tinylm_pair, messages, add_generation_prompt):
    files, auto = tinylm_pair
    prompt = files.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert prompt == auto.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
    for special in (False, True):
        assert files.encode(prompt, add_special_tokens=special) == auto.encode(prompt, add_special_tokens=special)


def test_a_template_sees_special_tokens_tojson_and_loop_controls_as_under_transformers(tmp_path):
    path = _directory(tmp_path, RICH_TEMPLATE, eos_token="<eos>")
    files, auto = file_tokenizer(path), _auto(path)
    assert files is not None
    messages = [
        {"role": "system", "content": 'be "brief" <b>&</b>'},
        {"role": "user", "content": "count from 1 to 3"},
        {"role": "assistant", "content": "1 2 3"},
    ]
    for generation_prompt in (False, True):
        expected = auto.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        assert files.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False) == expected
        assert "<eos>" in expected and "&lt;" not in expected
    assert files.apply_chat_template(messages, add_generation_prompt=True, tokenize=True) == auto.encode(
        auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    refused = [{"role": "assistant", "content": "hi"}]
    with pytest.raises(TemplateError, match="starts with a user"):
        files.apply_chat_template(refused, add_generation_prompt=True, tokenize=False)
    with pytest.raises(TemplateError, match="starts with a user"):
        auto.apply_chat_template(refused, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"tokenizer_class": "LlamaTokenizerFast"}, "a model's own class may rewrite the tokenizer at load"),
        ({"add_bos_token": True}, "transformers rewrites the post-processor"),
        ({"add_eos_token": False}, "transformers rewrites the post-processor"),
        ({"template": "{% generation %}{{ messages }}{% endgeneration %}"}, "assistant-mask blocks"),
        ({"template": "{% for m in messages %}"}, "a template Jinja cannot compile: transformers reports it"),
        ({"template": [{"name": "default", "template": "x"}]}, "named templates"),
        ({"eos_token": {"content": "<eos>", "special": True}}, "an AddedToken as a dict"),
    ],
)
def test_what_only_transformers_loads_the_same_is_left_to_it(tmp_path, change, why):
    config = dict(change)
    path = _directory(tmp_path, config.pop("template", None), **config)
    assert file_tokenizer(path) is None, why


def test_no_tokenizer_json_is_left_to_transformers(tmp_path):
    path = _directory(tmp_path)
    (path / "tokenizer.json").unlink()
    assert file_tokenizer(path) is None


def test_loading_tinylm_for_a_line_imports_neither_transformers_nor_torch():
    # What a shard-worker process does as it starts (controlplane/celery.py preloads the enabled models').
    code = (
        "import sys, django; django.setup()\n"
        "from controlplane.fleet.models import CatalogueModel\n"
        "from controlplane.kinds.generation.kind import model_tokenizer\n"
        "tokenizer = model_tokenizer(CatalogueModel(name='tinylm', tokenizer_dir='triton_models/tinylm/1/hf'))\n"
        "assert tokenizer.encode('count', add_special_tokens=False)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
