"""Sampling ops shared by every sampler: guidance, temperature / top-k / top-p filtering, and inverse-CDF
draws from pre-generated per-sample uniforms (no generator state inside the decode loop, no host sync,
and sample i of a batch sees exactly the randomness it would see alone)."""
from __future__ import annotations

from collections.abc import Sequence

import torch


@torch.library.custom_op("vgen::cumsum_last", mutates_args=())
def _aten_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().cumsum(-1)


@_aten_cumsum.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def cumsum(x: torch.Tensor) -> torch.Tensor:
    """``x.cumsum(-1)`` of a floating tensor. Compiled for CUDA it goes through one opaque op, so the step calls
    ATen's scan kernel (eager's sums) instead of inductor's own: inductor's split scan over LlamaGen's 16384-token
    vocabulary failed to build at batch 8 (docs/benchmarks-gpu.md). Eager code and CPUs keep the plain op (ATen's
    already, without a custom op's dispatch per call) and their bytes."""
    if x.device.type == "cuda" and torch.compiler.is_compiling():
        return torch.ops.vgen.cumsum_last(x)
    return x.cumsum(-1)


def guide(logits: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """Rows [cond; uncond] -> uncond + s * (cond - uncond) (LlamaGen's form)."""
    cond, uncond = logits.chunk(2, dim=0)
    return uncond + (cond - uncond) * cfg_scale


def filter_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """logits (..., V) -> probabilities after temperature, top-k then top-p (nucleus) truncation."""
    logits = logits / max(temperature, 1e-5)
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = cumsum(sorted_logits.softmax(-1))
        remove = cum > top_p
        remove = torch.cat([torch.zeros_like(remove[..., :1]), remove[..., :-1]], dim=-1)  # keep the crossing token
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits.softmax(-1)


def sample_from_probs(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs (..., V), u (...) in [0, 1) -> token ids (...). Never returns a zero-probability
    token (float rounding at the tail falls back to the last token with mass)."""
    cdf = cumsum(probs)
    v = (u * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, v, right=True).clamp_max(probs.shape[-1] - 1)
    ok = probs.gather(-1, idx) > 0
    last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.uint8).argmax(-1, keepdim=True)
    return torch.where(ok, idx, last).squeeze(-1)


def per_sample_uniforms(seeds: Sequence[int], shape: Sequence[int], device=None, stream: int = 0) -> torch.Tensor:
    """(len(seeds), *shape) uniforms; row i depends only on (seeds[i], stream), drawn on the CPU so every
    device gets the same numbers."""
    out = []
    for s in seeds:
        g = torch.Generator().manual_seed((int(s) * 1000 + stream) % 2 ** 64)  # any seed in 0..2^63-1 fits
        out.append(torch.rand(tuple(shape), generator=g))
    return torch.stack(out).to(device) if out else torch.empty((0, *shape), device=device)
