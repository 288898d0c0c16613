"""Generation specs: the shipped ones load, every error names its field, and tensor commands refuse them."""

from __future__ import annotations

import pytest

from build_engines.cli import main
from build_engines.errors import SpecError
from build_engines.generation_spec import GenerationSpec
from build_engines.spec import load_any_spec, load_spec
from tests.build_engines.conftest import write_spec

GOOD = """
name = "lm"

[generation]
hf_model = "lm/1/hf"
engine = "vllm"
tensor_parallel_size = 2
max_model_len = 128
max_num_seqs = 8
gpu_memory_utilization = 0.5
enable_prefix_caching = true
dtype = "auto"
gpu_memory_gib = 80
pool = "llm"
"""


def test_shipped_generation_specs_load_by_name():
    tiny = load_any_spec("tinylm_vllm")
    assert isinstance(tiny, GenerationSpec)
    assert (tiny.name, tiny.engine, tiny.triton_name) == ("tinylm", "vllm", "tinylm_vllm")
    assert tiny.hf_model == "tinylm/1/hf" and tiny.served_hf_path() == "/models/tinylm/1/hf"
    assert tiny.max_model_len == 256 and tiny.tensor_parallel_size == 1 and tiny.pool == "llm"
    llama = load_any_spec("llama3_8b_tp2")
    assert isinstance(llama, GenerationSpec) and llama.tensor_parallel_size == 2
    assert llama.served_hf_path() == llama.hf_model == "/weights/Meta-Llama-3-8B-Instruct"


def test_defaults_are_written_out(tmp_path):
    text = GOOD.replace("gpu_memory_utilization = 0.5\n", "").replace("max_num_seqs = 8\n", "")
    spec = load_any_spec(write_spec(tmp_path, text))
    assert spec.gpu_memory_utilization == 0.9 and spec.kv_cache_free_gpu_mem_fraction is None
    assert spec.max_num_seqs == 64 and spec.served_repository == "/models"
    trt = load_any_spec(write_spec(tmp_path, text.replace('"vllm"', '"tensorrt_llm"'), "trt.toml"))
    assert trt.kv_cache_free_gpu_mem_fraction == 0.9 and trt.gpu_memory_utilization is None
    assert trt.triton_name == "lm_trtllm"


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ('engine = "vllm"', 'engine = "tgi"', "generation.engine"),
        ("tensor_parallel_size = 2", "tensor_parallel_size = 0", "generation.tensor_parallel_size"),
        ("tensor_parallel_size = 2", 'tensor_parallel_size = "2"', "generation.tensor_parallel_size"),
        ("max_model_len = 128", "max_model_len = 1", "generation.max_model_len"),
        ("max_model_len = 128\n", "", "generation.max_model_len"),
        ("max_num_seqs = 8", "max_num_seqs = 0", "generation.max_num_seqs"),
        ("gpu_memory_utilization = 0.5", "gpu_memory_utilization = 1.5", "generation.gpu_memory_utilization"),
        (
            "gpu_memory_utilization = 0.5",
            "kv_cache_free_gpu_mem_fraction = 0.5",
            "generation.kv_cache_free_gpu_mem_fraction",
        ),
        ("enable_prefix_caching = true", "enable_prefix_caching = 1", "generation.enable_prefix_caching"),
        ('dtype = "auto"', 'dtype = "fp8"', "generation.dtype"),
        ("gpu_memory_gib = 80", "gpu_memory_gib = 0", "generation.gpu_memory_gib"),
        ("gpu_memory_gib = 80\n", "", "generation.gpu_memory_gib"),
        ('hf_model = "lm/1/hf"', 'hf_model = "../elsewhere"', "generation.hf_model"),
        ('hf_model = "lm/1/hf"\n', "", "generation.hf_model"),
        ('pool = "llm"', 'pool = "llm"\nserved_repository = "models"', "generation.served_repository"),
        ('pool = "llm"', 'pool = "llm"\ngpu_memory_utilisation = 0.5', "generation.gpu_memory_utilisation"),
        ('name = "lm"', 'name = "l m"', "name"),
        ('name = "lm"', 'name = "lm"\nsource = "x:y"', "source"),
    ],
)
def test_generation_spec_errors_name_the_field(tmp_path, old, new, field):
    assert old in GOOD
    with pytest.raises(SpecError) as caught:
        load_any_spec(write_spec(tmp_path, GOOD.replace(old, new, 1)))
    assert field in caught.value.fields, str(caught.value)
    assert f": {field}: " in str(caught.value) and caught.value.exit_code == 2


def test_trtllm_fraction_on_a_vllm_spec_says_which_engine_reads_it(tmp_path):
    text = GOOD.replace("gpu_memory_utilization = 0.5", "kv_cache_free_gpu_mem_fraction = 0.5")
    with pytest.raises(SpecError, match='applies to engine = "tensorrt_llm" only'):
        load_any_spec(write_spec(tmp_path, text))


def test_tensor_commands_refuse_a_generation_spec(tmp_path, capsys):
    path = write_spec(tmp_path, GOOD)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.fields == ["generation"]
    for command in ("export", "verify"):
        assert main([command, str(path), "--out", str(tmp_path / "out")]) == 2
        assert f"`{command}` is for tensor models" in capsys.readouterr().err
