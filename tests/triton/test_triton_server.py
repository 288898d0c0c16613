"""The adapter against a real tritonserver: identity model, error classes, explicit-mode reloads."""

from __future__ import annotations

import threading
import urllib.request

import numpy as np
import pytest

from controlplane.triton.client import (
    ModelInfo,
    ModelNotLoadedError,
    PermanentTritonError,
    TensorSpec,
    TransientTritonError,
    TritonClient,
)
from deploy.local.triton_server import LocalTriton, free_port


def test_server_health_and_metrics(triton_server: LocalTriton, triton_client: TritonClient) -> None:
    assert triton_client.is_live()
    assert triton_client.is_ready()
    with urllib.request.urlopen(triton_server.metrics_url, timeout=5) as resp:
        assert resp.status == 200


def test_identity_round_trips_a_batch(identity: TritonClient) -> None:
    batch = np.arange(24, dtype=np.float32).reshape(4, 6)
    out = identity.infer("identity", {"INPUT0": batch}, ["OUTPUT0"])
    np.testing.assert_array_equal(out["OUTPUT0"], batch)
    assert out["OUTPUT0"].dtype == np.float32


def test_identity_model_info(identity: TritonClient) -> None:
    assert identity.model_info("identity") == ModelInfo(
        name="identity",
        max_batch_size=1024,
        inputs=(TensorSpec("INPUT0", "FP32", (-1,)),),
        outputs=(TensorSpec("OUTPUT0", "FP32", (-1,)),),
    )


def test_wrong_dtype_and_unknown_input_are_permanent(identity: TritonClient) -> None:
    with pytest.raises(PermanentTritonError, match="FP64"):
        identity.infer("identity", {"INPUT0": np.ones((2, 3), dtype=np.float64)}, ["OUTPUT0"])
    with pytest.raises(PermanentTritonError, match="NOPE"):
        identity.infer("identity", {"NOPE": np.ones((2, 3), dtype=np.float32)}, ["OUTPUT0"])


def test_model_missing_from_repository_cannot_load(triton_client: TritonClient) -> None:
    with pytest.raises(PermanentTritonError):
        triton_client.load_model("no_such_model")
    assert not triton_client.is_model_ready("no_such_model")


def test_not_loaded_model_is_transient(triton_client: TritonClient) -> None:
    # Never loaded on this server: a placement state the caller fixes with ensure_loaded, not a tenant error.
    with pytest.raises(ModelNotLoadedError):
        triton_client.infer("no_such_model", {"INPUT0": np.ones((1, 1), dtype=np.float32)}, ["OUTPUT0"])


def test_closed_port_is_transient() -> None:
    with TritonClient(f"127.0.0.1:{free_port()}", timeout_s=5) as client:
        assert not client.is_live()
        assert not client.is_ready()
        with pytest.raises(TransientTritonError, match=r"(?i)connect"):
            client.infer("identity", {"INPUT0": np.ones((1, 1), dtype=np.float32)}, ["OUTPUT0"])


def test_reload_with_two_instances_keeps_serving(identity: TritonClient) -> None:
    config = identity.model_config("identity")
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    errors: list[Exception] = []
    served = 0
    stop = threading.Event()

    def traffic() -> None:
        nonlocal served
        batch = np.ones((8, 16), dtype=np.float32)
        while not stop.is_set():
            try:
                identity.infer("identity", {"INPUT0": batch}, ["OUTPUT0"])
                served += 1
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        identity.load_model("identity", config=config)
        assert identity.is_model_ready("identity")
    finally:
        stop.set()
        worker.join()
    assert errors == [], "a reload must not fail in-flight traffic"
    assert served > 0
    assert identity.model_config("identity")["instance_group"][0]["count"] == 2


def test_model_statistics_count_inferences(identity: TritonClient) -> None:
    identity.infer("identity", {"INPUT0": np.ones((3, 2), dtype=np.float32)}, ["OUTPUT0"])
    stats = identity.model_statistics("identity")["model_stats"][0]
    assert stats["name"] == "identity"
    assert int(stats["inference_count"]) >= 3


def test_embed_stub_answers_like_minilm(triton_client: TritonClient) -> None:
    """bench/embeddings.py's stand-in for a GPU-fast encoder: MiniLM's interface, a unit vector per text and
    [CLS] + words + [SEP] as TOKENS."""
    triton_client.ensure_loaded("embed_stub")
    texts = np.array([[b"a b c"], [b"d"], [b""]], dtype=np.object_)
    out = triton_client.infer("embed_stub", {"TEXT": texts}, ["EMBEDDING", "TOKENS"])
    assert out["EMBEDDING"].shape == (3, 384) and out["EMBEDDING"].dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out["EMBEDDING"], axis=1), 1.0, atol=1e-5)
    assert out["TOKENS"].ravel().tolist() == [5, 3, 2]
