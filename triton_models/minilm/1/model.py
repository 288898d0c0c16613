"""Triton python-backend model: all-MiniLM-L6-v2 sentence embeddings plus token counts for usage.

All texts of all requests handed to one `execute` call go through a single forward pass, then are split
back into exactly one response per request, in order. A bad request gets an error response of its own;
its neighbours still get their embeddings.
"""

import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


def _load_core():
    # By path, not by module name: the stub's sys.path does not include this directory, and the control
    # plane loads this very file the same way for its in-process parity baseline.
    # Called from initialize(), not at import: Triton first spawns a throwaway stub that imports this file
    # only to auto-complete the config, and importing torch there too would double the load time.
    path = Path(__file__).resolve().with_name("minilm_core.py")
    spec = importlib.util.spec_from_file_location("minilm_core", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _parameter(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value else default


def _ort_providers():
    try:
        import onnxruntime
    except ImportError:  # torch-only environment: the graph cannot run anyway
        return []
    return onnxruntime.get_available_providers()


def _invalid(message):
    return pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        threads = int(_parameter(config, "INTRA_OP_THREADS", "1"))
        model_dir = _parameter(config, "MODEL_DIR", None)
        core = _load_core()
        # KIND_GPU: Triton names the instance's GPU; the pass runs there (torch or ONNX Runtime's CUDA provider).
        device = core.instance_device(args.get("model_instance_kind", "CPU"), args.get("model_instance_device_id", 0))
        onnx_file = core.choose_onnx_file(
            _parameter(config, "RUNTIME", "auto"),
            Path(__file__).resolve().with_name("model.onnx"),
            device,
            _ort_providers(),
        )
        started = time.monotonic()
        self.encoder = core.MiniLMEncoder(model_dir=model_dir, threads=threads, onnx_file=onnx_file, device=device)
        pb_utils.Logger.log_info(
            f"minilm instance {args['model_instance_name']} loaded in {time.monotonic() - started:.2f}s "
            f"on {self.encoder.runtime} ({device}) with {threads} intra-op threads"
        )

    @staticmethod
    def _texts_of(request):
        """Decoded texts of one request, or a TritonError describing why the request is unusable."""
        tensor = pb_utils.get_input_tensor_by_name(request, "TEXT")
        if tensor is None:
            return _invalid("missing input TEXT")
        texts = []
        for index, item in enumerate(tensor.as_numpy().reshape(-1)):
            if isinstance(item, bytes):
                try:
                    texts.append(item.decode("utf-8"))
                except UnicodeDecodeError:
                    return _invalid(f"TEXT[{index}] is not valid UTF-8")
            elif isinstance(item, str):
                texts.append(item)
            else:
                return _invalid(f"TEXT[{index}] is {type(item).__name__}, expected a UTF-8 string")
        return texts

    def execute(self, requests):
        per_request = [self._texts_of(request) for request in requests]
        all_texts = [text for texts in per_request if isinstance(texts, list) for text in texts]
        try:
            # On a CPU the texts (one call's, or several merged where a config turns the batcher on) are
            # sorted and cut where padding would pass 1.1x the real tokens or at 16 texts. One thread on the
            # dispatcher's calls (a shard's sorted texts in thirds), texts/s: 1.25x and no cap 201, 1.1x 231,
            # 1.1x and 16 229; on pairs of them merged 203, 230, 240 (one pass of a merged call: 136).
            # bench/ceiling.py's PADDING_CUT sweeps the same cut. On a GPU padding is nearly free and each pass
            # costs its kernel launches: one pass (docs/GPU.md).
            cpu = self.encoder.device == "cpu"
            embeddings, token_counts = self.encoder.embed(
                all_texts, batch_size=16 if cpu else None, max_padding=1.1 if cpu else None
            )
        except Exception as exc:  # noqa: BLE001 - every request must still get a response
            error = pb_utils.TritonError(f"minilm forward pass failed: {exc}")
            return [pb_utils.InferenceResponse(error=error) for _ in requests]

        tokens = np.asarray(token_counts, dtype=np.int32).reshape(-1, 1)
        responses = []
        offset = 0
        for texts in per_request:
            if not isinstance(texts, list):
                responses.append(pb_utils.InferenceResponse(error=texts))
                continue
            end = offset + len(texts)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("EMBEDDING", embeddings[offset:end]),
                        pb_utils.Tensor("TOKENS", tokens[offset:end]),
                    ]
                )
            )
            offset = end
        return responses

    def finalize(self):
        self.encoder = None
