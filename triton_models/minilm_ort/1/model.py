"""Triton python-backend model: TEXT in, sentence EMBEDDING and TOKENS out, through ONNX Runtime.

Emitted by `python -m build_engines emit` from build_engines/templates/ort_model.py: edit the template,
not the copy. It exists because the pip-bundled tritonserver has only the python backend, so this is how
the exported model.onnx is served locally. It imports neither the control plane nor build_engines; its
settings come from config.pbtxt `parameters`, and model.onnx sits next to this file.
"""

import importlib
import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.max_length = int(params["max_length"])
        self.onnx_inputs = params["onnx_inputs"].split(",")
        self.onnx_output = params["onnx_output"]
        module_name, _, function = params["model_dir_from"].partition(":")
        model_dir = getattr(importlib.import_module(module_name), function)()

        import onnxruntime as ort
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        providers = ["CPUExecutionProvider"]
        # A KIND_GPU instance runs on the CUDA provider on its assigned device, or fails to load: it never
        # silently computes on the CPU while the planner counts it on a GPU.
        if args.get("model_instance_kind") == "GPU":
            if "CUDAExecutionProvider" not in ort.get_available_providers():
                raise RuntimeError(
                    f"a KIND_GPU instance needs onnxruntime-gpu; onnxruntime {ort.__version__} has only "
                    f"{ort.get_available_providers()}"
                )
            device = int(args.get("model_instance_device_id", 0))
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": device}))
        onnx_file = Path(__file__).with_name(params.get("onnx_file", "model.onnx"))
        self.session = ort.InferenceSession(str(onnx_file), providers=providers)

    def execute(self, requests):
        # One ONNX Runtime call for everything the dynamic batcher grouped, then split per request.
        responses = [None] * len(requests)
        batches = []
        for index, request in enumerate(requests):
            tensor = pb_utils.get_input_tensor_by_name(request, "TEXT")
            if tensor is None:
                responses[index] = _invalid("missing input TEXT")
                continue
            try:
                values = tensor.as_numpy().reshape(-1)
                texts = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values]
                batches.append((index, texts))
            except UnicodeDecodeError as exc:  # a bad request gets its own error, never its neighbours'
                responses[index] = _invalid(f"TEXT is not valid UTF-8: {exc}")
        texts = [text for _, request_texts in batches for text in request_texts]
        if texts:
            try:
                embeddings, tokens = self._embed(texts)
            except Exception as exc:  # noqa: BLE001 - whatever failed, every request must still get a response
                for index, _ in batches:
                    responses[index] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(f"embedding failed: {exc}")
                    )
                return responses
            start = 0
            for index, request_texts in batches:
                stop = start + len(request_texts)
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("EMBEDDING", embeddings[start:stop]),
                        pb_utils.Tensor("TOKENS", tokens[start:stop]),
                    ]
                )
                start = stop
        return responses

    def _embed(self, texts):
        encoded = self.tokenizer(
            texts, padding="longest", truncation=True, max_length=self.max_length, return_tensors="np"
        )
        feeds = {name: encoded[name].astype(np.int64) for name in self.onnx_inputs}
        (embeddings,) = self.session.run([self.onnx_output], feeds)
        tokens = encoded["attention_mask"].sum(axis=1, keepdims=True).astype(np.int32)
        return embeddings.astype(np.float32), tokens

    def finalize(self):
        self.session = None
        self.tokenizer = None


def _invalid(message):
    error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    return pb_utils.InferenceResponse(error=error)
