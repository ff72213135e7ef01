"""Decode-friendly linear layer.

At decode time a linear sees a handful of rows (batch x CFG), so it is bound by streaming the weight. On CPU, MKL
streams a row-major weight faster as ``W @ x^T`` than as ``x @ W^T`` (what ``F.linear`` does) for up to a few dozen
rows; for more rows (training, prefill) ``F.linear`` wins. That holds for CPUs only: on any other device it is plain
``F.linear`` (on CUDA it lost at most row counts; docs/benchmarks-gpu.md has both measurements). :data:`SMALL_ROWS` is
per device type, so a measurement can try it elsewhere. Same parameters and state-dict keys as ``nn.Linear``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL_ROWS = {"cpu": 64}  # device type -> the most rows run as W @ x^T (a type not named: never)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if (rows > SMALL_ROWS.get(x.device.type, 0) or x.requires_grad
            or weight.requires_grad and torch.is_grad_enabled()):
        return F.linear(x, weight, bias)
    y = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t()
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
