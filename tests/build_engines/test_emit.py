"""Emitted Triton model folders: valid configs, the same interface as triton_models/minilm, and a
python-backend model.py that really embeds text (run here against a stand-in for Triton's pb_utils)."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as pb

from build_engines.emit import emit_models
from build_engines.spec import load_spec
from build_engines.validate import validate_model_repository
from tests.build_engines.conftest import CORPUS, REPO_ROOT


def _config(path):
    return text_format.Parse(path.read_text(), pb.ModelConfig())


def test_emitted_configs_validate(built):
    assert sorted(p.name for p in built.models.iterdir()) == ["minilm_onnx", "minilm_ort", "minilm_trt"]
    assert validate_model_repository(built.models) == []


def test_onnx_and_trt_configs_follow_the_spec(built):
    onnx_cfg = _config(built.models / "minilm_onnx" / "config.pbtxt")
    assert onnx_cfg.backend == "onnxruntime" and onnx_cfg.max_batch_size == 8
    assert [(i.name, pb.DataType.Name(i.data_type), list(i.dims)) for i in onnx_cfg.input] == [
        ("input_ids", "TYPE_INT64", [-1]),
        ("attention_mask", "TYPE_INT64", [-1]),
    ]
    assert list(onnx_cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert (built.models / "minilm_onnx" / "1" / "model.onnx").is_file()
    assert (built.models / "minilm_onnx" / "1" / "manifest.json").is_file()

    trt_cfg = _config(built.models / "minilm_trt" / "config.pbtxt")
    assert trt_cfg.platform == "tensorrt_plan"
    assert dict(trt_cfg.cc_model_filenames) == {"8.0": "model_sm80.plan", "9.0": "model_sm90.plan"}
    assert trt_cfg.instance_group[0].kind == pb.ModelInstanceGroup.KIND_GPU
    assert (built.models / "minilm_trt" / "1").is_dir()


def test_ort_model_has_the_hand_written_minilm_interface(built):
    cfg = _config(built.models / "minilm_ort" / "config.pbtxt")
    assert cfg.backend == "python" and cfg.max_batch_size == 8
    assert [(i.name, pb.DataType.Name(i.data_type), list(i.dims)) for i in cfg.input] == [("TEXT", "TYPE_STRING", [1])]
    assert [(o.name, pb.DataType.Name(o.data_type), list(o.dims)) for o in cfg.output] == [
        ("EMBEDDING", "TYPE_FP32", [384]),
        ("TOKENS", "TYPE_INT32", [1]),
    ]
    reference = REPO_ROOT / "triton_models" / "minilm" / "config.pbtxt"
    if reference.is_file():  # the hand-written model, when present, must accept the same requests
        hand = _config(reference)
        assert [(i.name, i.data_type, list(i.dims)) for i in hand.input] == [
            (i.name, i.data_type, list(i.dims)) for i in cfg.input
        ]
        assert [(o.name, o.data_type, list(o.dims)) for o in hand.output] == [
            (o.name, o.data_type, list(o.dims)) for o in cfg.output
        ]


def test_emitted_model_py_imports_neither_control_plane_nor_build_engines(built):
    tree = ast.parse((built.models / "minilm_ort" / "1" / "model.py").read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"controlplane", "build_engines"}


def test_emit_is_deterministic(built, tmp_path):
    spec = load_spec(built.spec)
    emit_models(spec, built.out, tmp_path, echo=lambda _: None)
    for name in ("minilm_onnx", "minilm_trt", "minilm_ort"):
        assert (tmp_path / name / "config.pbtxt").read_text() == (built.models / name / "config.pbtxt").read_text()


class _Stub:
    """Just enough of triton_python_backend_utils to drive model.py outside Triton."""

    class TritonError:
        INVALID_ARG = 3

        def __init__(self, message, code=0):
            self._message, self.code = message, code

        def message(self):
            return self._message

    class Tensor:
        def __init__(self, name, array):
            self._name, self._array = name, array

        def name(self):
            return self._name

        def as_numpy(self):
            return self._array

    class InferenceResponse:
        def __init__(self, output_tensors=None, error=None):
            self.outputs = {t.name(): t.as_numpy() for t in output_tensors or []}
            self.error = error

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return request.get(name)


def _emitted_ort_model(built, monkeypatch) -> tuple[Any, str]:
    """The emitted minilm_ort model.py (with a stub of Triton's utils) and its config as Triton passes it."""
    stub = types.ModuleType("triton_python_backend_utils")
    for name in ("TritonError", "Tensor", "InferenceResponse", "get_input_tensor_by_name"):
        setattr(stub, name, getattr(_Stub, name))
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    model_dir = built.models / "minilm_ort"
    module_spec = importlib.util.spec_from_file_location("emitted_minilm_ort", model_dir / "1" / "model.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    config = json_format.MessageToDict(_config(model_dir / "config.pbtxt"), preserving_proto_field_name=True)
    return module, json.dumps(config)


@pytest.fixture
def ort_model(built, monkeypatch):
    module, config = _emitted_ort_model(built, monkeypatch)
    model = module.TritonPythonModel()
    model.initialize({"model_config": config, "model_instance_kind": "CPU"})
    yield model
    model.finalize()


def test_ort_model_on_a_gpu_instance_without_cuda_fails_to_load(built, monkeypatch):
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA; scripts/gpu_check.py covers GPU instances")
    module, config = _emitted_ort_model(built, monkeypatch)
    with pytest.raises(RuntimeError, match="needs onnxruntime-gpu"):
        module.TritonPythonModel().initialize(
            {"model_config": config, "model_instance_kind": "GPU", "model_instance_device_id": "0"}
        )


def _request(texts):
    return {"TEXT": _Stub.Tensor("TEXT", np.array([[t.encode()] for t in texts], dtype=object))}


def test_ort_model_embeds_and_isolates_a_bad_request(ort_model):
    sentences = CORPUS.read_text().splitlines()[:5]
    bad = {"TEXT": _Stub.Tensor("TEXT", np.array([[b"\xff\xfe"]], dtype=object))}
    first, broken, second, missing = ort_model.execute([_request(sentences[:2]), bad, _request(sentences[2:]), {}])
    assert broken.error is not None and "UTF-8" in broken.error.message()
    assert missing.error is not None and "missing input TEXT" in missing.error.message()
    embeddings = np.concatenate([first.outputs["EMBEDDING"], second.outputs["EMBEDDING"]])
    tokens = np.concatenate([first.outputs["TOKENS"], second.outputs["TOKENS"]])
    assert embeddings.shape == (5, 384) and embeddings.dtype == np.float32
    assert tokens.shape == (5, 1) and tokens.dtype == np.int32
    assert np.allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)
    assert tokens[0, 0] == 12  # [CLS] + 10 word pieces of the fox sentence + [SEP]

    core_path = REPO_ROOT / "triton_models" / "minilm" / "1" / "minilm_core.py"
    if core_path.is_file():  # same numbers as the hand-written torch model, when it exists
        core_spec = importlib.util.spec_from_file_location("minilm_core_for_parity", core_path)
        core = importlib.util.module_from_spec(core_spec)
        core_spec.loader.exec_module(core)
        expected, counts = core.MiniLMEncoder().embed(sentences)
        cosine = np.sum(expected * embeddings, axis=1)
        assert cosine.min() > 0.99999
        assert [int(c) for c in counts] == tokens[:, 0].tolist()


def test_committed_minilm_folders_match_the_shipped_spec(tmp_path):
    """A spec or template edit without re-running `emit minilm` would leave triton_models/ stale."""
    committed = REPO_ROOT / "triton_models"
    if not (committed / "minilm_ort" / "config.pbtxt").is_file():
        pytest.skip("triton_models/minilm_* not emitted yet")
    emit_models(load_spec("minilm"), tmp_path / "no-artefacts", tmp_path, echo=lambda _: None)
    for name in ("minilm_onnx", "minilm_trt", "minilm_ort"):
        fresh = (tmp_path / name / "config.pbtxt").read_text()
        assert (committed / name / "config.pbtxt").read_text() == fresh, "re-run: python -m build_engines emit minilm"
    assert (committed / "minilm_ort" / "1" / "model.py").read_bytes() == (
        tmp_path / "minilm_ort" / "1" / "model.py"
    ).read_bytes()
