"""PSNR between two uint8 image batches (tokenizer reconstruction quality)."""
from __future__ import annotations

import torch


def psnr(x: torch.Tensor, y: torch.Tensor) -> float:
    """PSNR in dB between two uint8 batches (N, C, H, W), computed per image and averaged over the batch
    (an image's MSE is floored at 1e-10, so identical images give a large finite value)."""
    mse = (x.float() - y.float()).pow(2).flatten(1).mean(1).clamp_min(1e-10)
    return float((10 * torch.log10(255.0 ** 2 / mse)).mean())
