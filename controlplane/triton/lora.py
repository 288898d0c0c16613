"""LoRA adapters on a running engine: load, unload and list through the engine's own control request (an
inference request whose only input is ``lora_control``, JSON ``{"action", "name", "path"}``, answered with one
response whose ``text_output`` is ``{"adapters": [...]}``: triton_models/tinylm/1/model.py). The engine is
decoupled, so the request goes over a stream. Part of triton/, the one package that imports tritonclient;
failures are classified by triton/errors.py like every other call."""

from __future__ import annotations

import json
import queue
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from controlplane.triton.client import _CHANNEL_ARGS
from controlplane.triton.errors import TransientTritonError, TritonError, classify

CONTROL_INPUT = "lora_control"
LORA_ACTIONS = ("load", "unload", "list")


def lora_control(
    url: str, model: str, action: str, *, name: str | None = None, path: str | None = None, timeout_s: float = 60.0
) -> list[str]:
    """Send one control request to ``model`` on the server at ``url`` (gRPC host:port) and return the adapters
    its engine holds afterwards. ``path`` None: the engine loads ``name`` from its own adapters directory."""
    if action not in LORA_ACTIONS:
        raise ValueError(f"lora_control action must be one of {', '.join(LORA_ACTIONS)}, got {action!r}")
    command: dict[str, Any] = {"action": action}
    if name is not None:
        command["name"] = name
    if path is not None:
        command["path"] = path
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url=url, verbose=False, channel_args=_CHANNEL_ARGS)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        control = grpcclient.InferInput(CONTROL_INPUT, [1], "BYTES")
        control.set_data_from_numpy(np.array([json.dumps(command).encode()], dtype=np.object_))
        client.async_stream_infer(model, [control], enable_empty_final_response=True)
        try:
            result, error = answers.get(timeout=timeout_s)
        except queue.Empty:
            raise TransientTritonError(f"no answer to lora_control {action} from {model} in {timeout_s:g}s") from None
        if error is not None:
            raise classify(error)
        return [str(n) for n in json.loads(result.as_numpy("text_output")[0])["adapters"]]
    except TritonError:
        raise
    except Exception as exc:  # a connection or stream failure: classified, never swallowed
        raise classify(exc) from exc
    finally:
        try:
            client.stop_stream()
        finally:
            client.close()
