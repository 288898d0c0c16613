"""Emitted generation models: the vLLM and TensorRT-LLM configs validate against Triton's schema and the
backends' vendored keys, a key the backends do not know fails, the spec is checked against the model's
config.json, and the manifest carries what the catalogue needs. No GPU, no vLLM, no TensorRT-LLM here."""

from __future__ import annotations

import json

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from build_engines.backend_keys import model_json_problems, vllm_engine_args
from build_engines.cli import main
from build_engines.emit_generation import emit_generation
from build_engines.errors import SpecError
from build_engines.gpu import detect_gpu
from build_engines.spec import load_any_spec
from build_engines.validate import validate_model_repository
from tests.build_engines.conftest import write_spec
from tests.build_engines.test_generation_spec import GOOD

GIB = 1024**3


def make_hf_dir(models, *, heads=4, kv_heads=None, layers=2, hidden=64, positions=256, dtype="float32", chat=True):
    """A Hugging Face-like directory: config.json (GPT-2 key names unless kv_heads), weights, tokenizer config."""
    hf = models / "lm" / "1" / "hf"
    hf.mkdir(parents=True)
    if kv_heads is None:
        config = {"model_type": "gpt2", "n_layer": layers, "n_head": heads, "n_embd": hidden, "n_positions": positions}
    else:
        config = {"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": heads,
                  "num_key_value_heads": kv_heads, "hidden_size": hidden, "max_position_embeddings": positions}  # fmt: skip
    (hf / "config.json").write_text(json.dumps({**config, "torch_dtype": dtype}))
    (hf / "model.safetensors").write_bytes(b"\0" * 4000)
    (hf / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"} if chat else {}))
    # As in triton_models/tinylm: the HF directory sits in the version folder of the CPU model that serves it.
    (models / "lm" / "config.pbtxt").write_text(
        'name: "lm" backend: "python" input [{name: "text_input" data_type: TYPE_STRING dims: [1]}]'
    )
    (models / "lm" / "1" / "model.py").write_text("")
    return hf


def emit(tmp_path, text=GOOD, *, with_model=True, **hf):
    models = tmp_path / "triton_models"
    models.mkdir(parents=True, exist_ok=True)
    if with_model:
        make_hf_dir(models, **hf)
    spec = load_any_spec(write_spec(tmp_path, text))
    folder = emit_generation(spec, tmp_path / "out", models, command="test", echo=lambda _: None)
    manifest = json.loads((tmp_path / "out" / spec.triton_name / "manifest.json").read_text())
    return spec, folder, manifest


def _config(folder):
    return text_format.Parse((folder / "config.pbtxt").read_text(), pb.ModelConfig())


def test_vllm_model_is_valid_and_follows_the_spec(tmp_path):
    _, folder, _ = emit(tmp_path)
    assert validate_model_repository(folder.parent) == []
    config = _config(folder)
    assert (config.name, config.backend, config.max_batch_size) == ("lm_vllm", "vllm", 0)
    assert config.model_transaction_policy.decoupled
    assert [pb.ModelInstanceGroup.Kind.Name(g.kind) for g in config.instance_group] == ["KIND_MODEL"]
    assert [t.name for t in config.input][:3] == ["text_input", "stream", "sampling_parameters"]
    assert "image" not in {t.name for t in config.input}  # images are refused by the service
    model_json = json.loads((folder / "1" / "model.json").read_text())
    assert model_json == {
        "model": "/models/lm/1/hf",
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.5,
        "max_num_seqs": 8,
        "max_model_len": 128,
        "enable_prefix_caching": True,
        "dtype": "auto",
    }
    assert set(model_json) <= vllm_engine_args()


def test_manifest_has_what_the_catalogue_registers(tmp_path):
    _, _, manifest = emit(tmp_path)
    assert manifest["kind"] == "generation" and manifest["triton_name"] == "lm_vllm"
    assert manifest["endpoints"] == ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
    assert manifest["context_length"] == 128 and manifest["gpus_per_instance"] == 2
    assert manifest["memory_per_gpu_bytes"] == int(0.5 * 80 * GIB)  # what vLLM preallocates per GPU
    assert manifest["tokenizer_dir"] == "/models/lm/1/hf" and manifest["pool"] == "llm"
    assert manifest["inflight_sequences_per_instance"] == 16
    assert manifest["structured_outputs"] is True  # vLLM decodes under a grammar by default (vllm_model_json)
    # 2 layers x K,V x 2 KV heads per GPU (4 over TP 2) x head_dim 16 x 2 bytes (auto: float16)
    assert manifest["estimate"]["kv_bytes_per_token_per_gpu"] == 2 * 2 * 2 * 16 * 2
    assert manifest["estimate"]["weights_bytes_per_gpu"] == 4000 * 2 // 4 // 2
    assert set(manifest["served_files"]) == {"config.pbtxt", "1/model.json"}
    _, _, no_chat = emit(tmp_path / "b", chat=False)
    assert no_chat["endpoints"] == ["/v1/completions"]  # without a chat template only completions


def test_emit_is_deterministic_and_writes_configs_without_the_model(tmp_path):
    spec, folder, _ = emit(tmp_path)
    first = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    emit_generation(spec, tmp_path / "out", folder.parent, command="again", echo=lambda _: None)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == first
    _, bare, manifest = emit(tmp_path / "c", with_model=False)
    assert (bare / "1" / "model.json").is_file() and manifest["model_checks"].startswith("not run")
    assert manifest["endpoints"] is None and manifest["estimate"] is None


@pytest.mark.parametrize(
    ("hf", "spec_change", "field"),
    [
        ({"heads": 3, "hidden": 48}, None, "generation.tensor_parallel_size"),
        ({"positions": 64}, None, "generation.max_model_len"),
        # 32 layers x 2 x 64 KV heads / 2 x 128 x 2 bytes = 1 MiB per token per GPU: 128 tokens need 128 MiB
        ({"heads": 64, "kv_heads": 64, "layers": 32, "hidden": 8192}, ("gpu_memory_gib = 80", "gpu_memory_gib = 0.1"),
         "generation.gpu_memory_utilization"),
    ],
)  # fmt: skip
def test_spec_is_checked_against_the_model(tmp_path, hf, spec_change, field):
    text = GOOD.replace(*spec_change) if spec_change else GOOD
    with pytest.raises(SpecError) as caught:
        emit(tmp_path, text, **hf)
    assert field in caught.value.fields, str(caught.value)
    assert not (tmp_path / "triton_models" / "lm_vllm").exists()  # nothing written on a bad spec


def test_unknown_and_refused_engine_arguments_fail(tmp_path):
    assert model_json_problems({"model": "m", "max_num_seqs": 4}) == []
    (problem,) = model_json_problems({"model": "m", "gpu_mem_util": 0.5})
    assert "'gpu_mem_util' is not a vLLM engine argument" in problem
    assert "deprecated property" in model_json_problems({"model": "m", "disable_log_requests": True})[0]
    assert "'model'" in model_json_problems({"max_num_seqs": 4})[0]
    # A key only the newer snapshot has is refused: the image's vLLM may predate it.
    assert model_json_problems({"model": "m", "enable_dbo": True})
    # Guided decoding is on by default in both snapshots; naming its backend is refused either way
    # (deprecated in the newer, absent from the older), so the emitted model.json names none.
    assert "deprecated" in model_json_problems({"model": "m", "guided_decoding_backend": "xgrammar"})[0]
    assert model_json_problems({"model": "m", "structured_outputs_config": {"backend": "auto"}})
    # And in an emitted repository, validate-configs catches a hand edit.
    _, folder, _ = emit(tmp_path)
    path = folder / "1" / "model.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_num_seq": 4}))
    (error,) = validate_model_repository(folder.parent)
    assert error.startswith("lm_vllm/config.pbtxt: 1/model.json: 'max_num_seq' is not a vLLM engine argument")


def test_vllm_rules_tensor_parallel_kind_and_decoupled(tmp_path):
    _, folder, _ = emit(tmp_path)
    text = (folder / "config.pbtxt").read_text()
    (folder / "config.pbtxt").write_text(
        text.replace("KIND_MODEL", "KIND_GPU").replace("decoupled: true", "decoupled: false")
    )
    errors = validate_model_repository(folder.parent)
    assert any("need instance_group kind KIND_MODEL" in e for e in errors), errors
    assert any("decoupled: true" in e for e in errors), errors
    (folder / "config.pbtxt").write_text(text.replace('"REPORT_CUSTOM_METRICS"', '"REPORT_METRICS"'))
    assert any(
        "'REPORT_METRICS' is not one the vLLM backend reads" in e for e in validate_model_repository(folder.parent)
    )
    (folder / "config.pbtxt").write_text(text.replace("TYPE_STRING", "TYPE_INT32", 1))
    assert any("input 'text_input' is TYPE_INT32" in e for e in validate_model_repository(folder.parent))


TRT = GOOD.replace('"vllm"', '"tensorrt_llm"').replace("gpu_memory_utilization", "kv_cache_free_gpu_mem_fraction")


def test_trtllm_model_is_valid_and_configured_for_inflight_batching(tmp_path):
    _, folder, manifest = emit(tmp_path, TRT)
    assert folder.name == "lm_trtllm" and validate_model_repository(folder.parent) == []
    config = _config(folder)
    assert config.backend == "tensorrtllm" and config.max_batch_size == 8
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert parameters["gpt_model_type"] == "inflight_fused_batching"
    assert parameters["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert parameters["kv_cache_free_gpu_mem_fraction"] == "0.5"
    assert parameters["enable_kv_cache_reuse"] == "true"
    assert parameters["gpt_model_path"] == "/models/lm_trtllm/1/engine"
    scalars = [t for t in config.input if list(t.dims) == [1]]
    assert scalars and all(t.HasField("reshape") for t in scalars)
    # Guided decoding (response_format json), as tensorrtllm_backend's docs/guided_decoding.md configures it.
    assert parameters["guided_decoding_backend"] == "xgrammar"
    assert parameters["xgrammar_tokenizer_info_path"] == "/models/lm_trtllm/1/engine/xgrammar_tokenizer_info.json"
    assert manifest["structured_outputs"] is True
    convert, build, tokenizer_info = manifest["build"]["commands"]
    assert tokenizer_info[1].endswith("generate_xgrammar_tokenizer_info.py")
    assert tokenizer_info[tokenizer_info.index("--output_dir") + 1].endswith("/engine")
    assert convert[convert.index("--tp_size") + 1] == "2" and build[0] == "trtllm-build"
    assert build[build.index("--max_seq_len") + 1] == "128" and "--use_paged_context_fmha" in build
    weights = 4000 * 2 // 4 // 2
    assert manifest["memory_per_gpu_bytes"] == weights + int(0.5 * (80 * GIB - weights))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ('"guaranteed_no_evict"', '"guaranteed_no_evicts"', "'batch_scheduler_policy' must be one of"),
        ('"inflight_fused_batching"', '"inflight_batching"', "'gpt_model_type' must be one of"),
        ('key: "max_beam_width"', 'key: "beam_width"', "'beam_width' is not in TensorRT-LLM's"),
        ('string_value: "0.5"', 'string_value: "1.5"', "'kv_cache_free_gpu_mem_fraction' must be a number"),
        ('key: "gpt_model_path"', 'key: "engine_dir"', "'engine_dir' is not in TensorRT-LLM's"),
        ('string_value: "xgrammar"', 'string_value: "outlines"', "'guided_decoding_backend' must be one of"),
    ],
)
def test_trtllm_parameters_outside_the_template_fail(tmp_path, old, new, expected):
    _, folder, _ = emit(tmp_path, TRT)
    text = (folder / "config.pbtxt").read_text()
    assert old in text
    (folder / "config.pbtxt").write_text(text.replace(old, new, 1))
    errors = validate_model_repository(folder.parent)
    assert any(expected in e for e in errors), errors


@pytest.mark.skipif(detect_gpu() is not None, reason="a GPU host: the build would really start")
def test_build_cannot_run_here_for_trtllm_and_has_nothing_to_do_for_vllm(tmp_path, capsys):
    models = tmp_path / "triton_models"
    make_hf_dir(models)
    trt = write_spec(tmp_path, TRT, "trt.toml")
    assert main(["build", str(trt), "--out", str(tmp_path / "out"), "--models-dir", str(models)]) == 4
    message = capsys.readouterr().err.strip().removeprefix("error: ")
    assert message.startswith("Cannot build a TensorRT-LLM engine here because no NVIDIA GPU was found")
    assert "\n" not in message and ". " not in message and message.endswith(".")
    assert main(["all", str(trt), "--out", str(tmp_path / "out"), "--models-dir", str(models)]) == 0
    assert "skipped: Cannot build a TensorRT-LLM engine" in capsys.readouterr().out
    vllm = write_spec(tmp_path, GOOD, "vllm.toml")
    assert main(["build", str(vllm), "--out", str(tmp_path / "out"), "--models-dir", str(models)]) == 0
    assert "nothing to build" in capsys.readouterr().out
