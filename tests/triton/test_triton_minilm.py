"""The minilm Triton model: parity with the in-process encoder, token counts, per-request errors."""

from __future__ import annotations

import importlib.util
import sys
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from controlplane.triton.client import PermanentTritonError, TransientTritonError, TritonClient
from deploy.local.inprocess import InProcessMiniLM
from deploy.local.triton_server import REPO_ROOT, LocalTriton

SENTENCES = [
    "A man is eating food.",
    "The new movie is awesome.",
    "Batch inference packs many requests into one forward pass.",
    "",
    "Ünïcödé text, emoji 🚀 and punctuation!!!",
]


def _texts(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)


def embed(client: TritonClient, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    out = client.infer("minilm", {"TEXT": _texts(texts)}, ["EMBEDDING", "TOKENS"])
    return out["EMBEDDING"], out["TOKENS"]


def test_matches_in_process_encoder(minilm: TritonClient, inprocess_minilm: InProcessMiniLM) -> None:
    embeddings, tokens = embed(minilm, SENTENCES)
    assert embeddings.shape == (5, 384)
    assert embeddings.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, atol=1e-5)

    expected, expected_tokens = inprocess_minilm.embed(SENTENCES)
    cosine = np.sum(embeddings * expected, axis=1)
    assert cosine.min() >= 0.9999, cosine
    assert tokens.shape == (5, 1)
    assert tokens.ravel().tolist() == expected_tokens
    assert expected_tokens[3] == 2, "an empty text is just [CLS] [SEP]"


def test_in_process_order_does_not_depend_on_sorting(inprocess_minilm: InProcessMiniLM) -> None:
    sorted_run, tokens_a = inprocess_minilm.embed(SENTENCES, batch_size=2, sort_by_length=True)
    file_order, tokens_b = inprocess_minilm.embed(SENTENCES, batch_size=2, sort_by_length=False)
    assert tokens_a == tokens_b
    assert np.sum(sorted_run * file_order, axis=1).min() >= 0.9999


def test_similar_sentences_are_closer(minilm: TritonClient) -> None:
    e, _ = embed(minilm, ["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell sharply."])
    assert e[0] @ e[1] > e[0] @ e[2] + 0.2


def test_long_text_is_truncated_to_256_tokens(minilm: TritonClient) -> None:
    _, tokens = embed(minilm, ["word " * 1000])
    assert tokens.ravel().tolist() == [256]


def test_bad_request_fails_alone(minilm: TritonClient) -> None:
    # Sent together so the dynamic batcher can put them in one execute() call.
    payloads = [_texts(["good one"]), np.array([[b"\xff\xfe not utf-8"]], dtype=np.object_), _texts(["good two"])]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(minilm.infer, "minilm", {"TEXT": p}, ["EMBEDDING"]) for p in payloads]
    assert futures[0].result()["EMBEDDING"].shape == (1, 384)
    assert futures[2].result()["EMBEDDING"].shape == (1, 384)
    with pytest.raises(PermanentTritonError, match="UTF-8"):
        futures[1].result()


def test_client_deadline_is_transient(minilm: TritonClient, triton_server: LocalTriton) -> None:
    # Few texts: the server still computes a request whose client gave up, delaying the tests after this.
    with TritonClient(triton_server.grpc_url, timeout_s=0.001) as impatient, pytest.raises(TransientTritonError):
        embed(impatient, SENTENCES)


class _FakePbUtils(types.ModuleType):
    """The parts of triton_python_backend_utils that model.execute touches."""

    class TritonError(Exception):
        INTERNAL, INVALID_ARG = 13, 3

        def __init__(self, message: str, code: int = 13) -> None:
            super().__init__(message)
            self.code = code

    class Tensor:
        def __init__(self, name: str, array: np.ndarray) -> None:
            self.name, self.array = name, array

        def as_numpy(self) -> np.ndarray:
            return self.array

    class InferenceResponse:
        def __init__(self, output_tensors: list[Any] | None = None, error: Any = None) -> None:
            self.outputs = {t.name: t.array for t in output_tensors or []}
            self.error = error

    @staticmethod
    def get_input_tensor_by_name(request: dict[str, Any], name: str) -> Any:
        return request.get(name)


class _FakeEncoder:
    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.calls: list[list[str]] = []
        self.max_paddings: list[float | None] = []
        self.batch_sizes: list[int | None] = []

    def embed(
        self, texts: list[str], batch_size: int | None = None, max_padding: float | None = None
    ) -> tuple[np.ndarray, list[int]]:
        self.calls.append(list(texts))
        self.max_paddings.append(max_padding)
        self.batch_sizes.append(batch_size)
        return np.array([[float(len(t))] * 384 for t in texts], dtype=np.float32), [len(t) for t in texts]


def _minilm_model(monkeypatch: pytest.MonkeyPatch, device: str = "cpu") -> Any:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _FakePbUtils("triton_python_backend_utils"))
    path = Path(REPO_ROOT, "triton_models", "minilm", "1", "model.py")
    spec = importlib.util.spec_from_file_location("_minilm_model_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = module.TritonPythonModel()
    model.encoder = _FakeEncoder(device)
    return model


def test_merged_calls_are_cut_by_padding_on_cpu_and_run_in_one_pass_on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = {"TEXT": _FakePbUtils.Tensor("TEXT", np.array([[b"a"], [b"bbb"]], dtype=object))}
    for device, padding, size in (("cpu", 1.1, 16), ("cuda:0", None, None)):
        model = _minilm_model(monkeypatch, device)
        model.execute([texts])
        assert (model.encoder.max_paddings, model.encoder.batch_sizes) == ([padding], [size]), device


def test_execute_one_pass_one_response_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _minilm_model(monkeypatch)
    tensor = _FakePbUtils.Tensor
    requests = [
        {"TEXT": tensor("TEXT", np.array([[b"a"], [b"bbb"]], dtype=object))},
        {"TEXT": tensor("TEXT", np.array([[b"\xff"]], dtype=object))},
        {},
        {"TEXT": tensor("TEXT", np.array([[b"cc"]], dtype=object))},
    ]
    responses = model.execute(requests)
    assert len(responses) == 4
    assert model.encoder.calls == [["a", "bbb", "cc"]], "one embed call over the good requests' texts"
    assert responses[0].error is None and responses[0].outputs["TOKENS"].ravel().tolist() == [1, 3]
    assert responses[0].outputs["EMBEDDING"].shape == (2, 384)
    assert "UTF-8" in str(responses[1].error) and responses[1].error.code == _FakePbUtils.TritonError.INVALID_ARG
    assert "missing input TEXT" in str(responses[2].error)
    assert responses[3].outputs["TOKENS"].ravel().tolist() == [2]


def test_served_on_the_runtime_the_install_prepared(minilm: TritonClient, triton_server: LocalTriton) -> None:
    """RUNTIME "auto": ONNX Runtime when `make install` exported model.onnx next to the model, else torch."""
    from deploy.local.inprocess import served_runtime

    loaded = [line for line in triton_server.log_tail(400).splitlines() if "minilm instance" in line]
    assert loaded and all(f"on {served_runtime()} (cpu) with" in line for line in loaded), loaded


@pytest.mark.parametrize(
    ("runtime", "exists", "device", "providers", "expected"),
    [
        ("auto", True, "cpu", ["CPUExecutionProvider"], "onnx"),
        ("auto", False, "cpu", ["CPUExecutionProvider"], None),
        ("torch", True, "cpu", ["CPUExecutionProvider"], None),
        # A GPU instance runs ONNX Runtime only where it has the CUDA provider; else torch on that GPU.
        ("auto", True, "cuda:1", ["CPUExecutionProvider"], None),
        ("auto", True, "cuda:1", ["CUDAExecutionProvider", "CPUExecutionProvider"], "onnx"),
        ("onnxruntime", True, "cuda:0", ["CUDAExecutionProvider", "CPUExecutionProvider"], "onnx"),
        ("onnxruntime", True, "cuda:0", ["CPUExecutionProvider"], RuntimeError),
        ("onnxruntime", False, "cpu", ["CPUExecutionProvider"], FileNotFoundError),
        ("tensorrt", True, "cpu", ["CPUExecutionProvider"], ValueError),
    ],
)
def test_runtime_choice_per_instance_device(
    tmp_path: Path, runtime: str, exists: bool, device: str, providers: list[str], expected: Any
) -> None:
    from deploy.local.inprocess import load_minilm_core

    core = load_minilm_core()
    graph = tmp_path / "model.onnx"
    if exists:
        graph.write_bytes(b"graph")
    if isinstance(expected, type):
        with pytest.raises(expected):
            core.choose_onnx_file(runtime, graph, device, providers)
    else:
        assert core.choose_onnx_file(runtime, graph, device, providers) == (graph if expected else None)


def test_instance_device_follows_the_instance_kind() -> None:
    from deploy.local.inprocess import load_minilm_core

    core = load_minilm_core()
    assert core.instance_device("GPU", "3") == "cuda:3"
    assert core.instance_device("CPU", 0) == "cpu"
    assert core.instance_device("MODEL", 0) == "cpu"


def test_gpu_instance_without_cuda_fails_to_load_instead_of_running_on_the_cpu() -> None:
    import torch

    from deploy.local.inprocess import load_minilm_core

    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA device; build_engines/gpu_check.sh runs the GPU instance")
    with pytest.raises(RuntimeError, match="sees no CUDA device"):
        load_minilm_core().MiniLMEncoder(device="cuda:0")


def test_the_two_in_process_runtimes_agree() -> None:
    from deploy.local.inprocess import MINILM_ONNX_PATH

    if not MINILM_ONNX_PATH.exists():
        pytest.skip("no exported model.onnx: run `make install` (build_engines export minilm)")
    torch_run, torch_tokens = InProcessMiniLM().embed(SENTENCES)
    ort_run, ort_tokens = InProcessMiniLM(runtime="onnxruntime").embed(SENTENCES)
    assert ort_tokens == torch_tokens
    assert np.sum(torch_run * ort_run, axis=1).min() >= 0.99999


@pytest.mark.parametrize("max_padding", [None, 1.0, 1.25, 3.0])
def test_chunks_cover_every_text_once_within_size_and_padding(max_padding: float | None) -> None:
    from deploy.local.inprocess import load_minilm_core

    chunks_of = load_minilm_core()._chunks
    lengths = [3, 40, 5, 5, 120, 9, 40, 41, 2, 7, 7, 7]
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    chunks = chunks_of(order, lengths, 4, max_padding)
    assert [i for chunk in chunks for i in chunk] == order
    assert all(len(chunk) <= 4 for chunk in chunks)
    if max_padding is not None:
        for chunk in chunks:
            if len(chunk) > 1:
                assert len(chunk) * max(lengths[i] for i in chunk) <= max_padding * sum(lengths[i] for i in chunk)
    else:
        assert [len(c) for c in chunks] == [4, 4, 4]
