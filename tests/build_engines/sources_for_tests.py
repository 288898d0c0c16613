"""Tiny torch models that specs in these tests point `source` at."""

from __future__ import annotations

import torch
from torch import nn


class _CumulativeMax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cummax(x, dim=1).values  # no ONNX symbolic exists for aten::cummax


def build_unsupported() -> nn.Module:
    return _CumulativeMax()


def build_not_a_module() -> str:
    return "not a module"
