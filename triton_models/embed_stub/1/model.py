"""embed_stub: one fixed unit vector per text and a word count as TOKENS (see config.pbtxt for why).

The vector is a seeded random unit vector, not zeros: its 384 floats cost the control plane as much to
encode as a real embedding's do.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

DIM = 384


class TritonPythonModel:
    def initialize(self, args):
        vector = np.random.default_rng(384).standard_normal(DIM).astype(np.float32)
        self.vector = vector / np.linalg.norm(vector)

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            # [CLS] + words + [SEP]: about what MiniLM's word pieces count for plain English.
            tokens = np.array([[len(t.split()) + 2] for t in texts], dtype=np.int32)
            embeddings = np.broadcast_to(self.vector, (len(texts), DIM)).copy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("EMBEDDING", embeddings), pb_utils.Tensor("TOKENS", tokens)]
                )
            )
        return responses
