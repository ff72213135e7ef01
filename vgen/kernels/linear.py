"""Decode-friendly linear layer.

At decode time a linear sees a handful of rows (batch x CFG), so it is bound by streaming the weight.
On CPU, MKL streams a row-major weight ~1.5-1.9x faster as ``W @ x^T`` than as ``x @ W^T`` (what
``F.linear`` does) for up to a few dozen rows; for more rows (training, prefill) ``F.linear`` wins.
That is a measurement of CPUs: on any other device (CUDA's cuBLAS picks its own kernel for small rows, and the
transposes would be two more launches) it is plain ``F.linear``. Same parameters and state-dict keys as
``nn.Linear``.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL_ROWS = 64


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    if (x.device.type != "cpu" or rows > SMALL_ROWS or x.requires_grad
            or weight.requires_grad and torch.is_grad_enabled()):
        return F.linear(x, weight, bias)
    y = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t()
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
