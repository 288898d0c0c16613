"""tinylm's model.py sends responses from a thread of its own (`_Responder`): in the order they were built, and a
response that cannot be sent (its caller went away) cancels that request in the engine, not its neighbours'. The
real stub's sends are covered end to end by tests/triton/test_triton_tinylm.py; here the sender fails on purpose."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest

MODEL_PY = Path(__file__).resolve().parents[2] / "triton_models" / "tinylm" / "1" / "model.py"


class _Logger:
    warnings: ClassVar[list[str]] = []

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.warnings.append(message)


class _Engine:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


class _Sender:
    def __init__(self, sent: list[tuple[str, int]], *, broken: bool = False) -> None:
        self.sent, self.broken = sent, broken

    def send(self, response: str, flags: int = 0) -> None:
        if self.broken:
            raise RuntimeError("the client went away")
        self.sent.append((response, flags))


@pytest.fixture
def model_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Logger = _Logger  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    spec = importlib.util.spec_from_file_location("_tinylm_model_under_test", MODEL_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_responses_go_in_order_and_an_unsendable_one_cancels_only_its_request(model_module):
    engine, sent = _Engine(), []
    good, gone = _Sender(sent), _Sender(sent, broken=True)
    responder = model_module._Responder(engine)
    responder.send(good, "a", "a-delta")
    responder.send(gone, "b", "b-final", 2)
    responder.send(good, "a", "a-final", 2)
    responder.stop()  # drains the queue first
    assert sent == [("a-delta", 0), ("a-final", 2)]
    assert engine.cancelled == ["b"]
    assert any("b" in warning and "cancelling" in warning for warning in _Logger.warnings)
