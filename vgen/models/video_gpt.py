"""A LlamaGen GPT over video tokens: the (t, h, w) raster of a clip with 3-D rotary positions.

Everything is LlamaGen's GPT (same blocks, parameter names, cache and sampler interface); only the grid and the
RoPE table differ. Token (t, h, w) sits at raster index t*H*W + h*W + w. Each head's rotation pairs are split in
three: the first group turns with the frame index t, the second with the row h, the third with the column w
(LlamaGen's 2D table is the same construction with two groups), interleaved (even, odd) pairs as in LlamaGen.
Condition positions get all-zero rows, as in LlamaGen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vgen.models.gpt import GPT, GPTConfig, gpt_preset, infer_gpt, is_gpt
from vgen.models.loading import register_kind


@dataclass
class VideoGPTConfig(GPTConfig):
    latent_shape: tuple = (8, 8, 8)  # (T, H, W) token grid; block_size follows it

    def __post_init__(self):
        self.latent_shape = tuple(int(s) for s in self.latent_shape)
        if len(self.latent_shape) != 3 or min(self.latent_shape) < 1:
            raise ValueError(f"latent_shape is the (T, H, W) token grid, got {self.latent_shape}")
        self.block_size = math.prod(self.latent_shape)


def axis_pairs(head_dim: int, axes: int = 3) -> list[int]:
    """Rotation pairs per axis: head_dim/2 pairs split as evenly as possible, the remainder to the first axis."""
    pairs = head_dim // 2
    each = pairs // axes
    return [pairs - each * (axes - 1)] + [each] * (axes - 1)


def rope_table_nd(shape: tuple[int, ...], head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """(cls_token_num + prod(shape), head_dim // 2, 2) cos/sin table: group a of the rotation pairs turns with
    coordinate a of the token; zero rows for the condition."""
    groups = []
    coords = torch.stack(torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij"), -1).reshape(-1, len(shape))
    for a, k in enumerate(axis_pairs(head_dim, len(shape))):
        freqs = 1.0 / (base ** (torch.arange(k, dtype=torch.float32) / max(k, 1)))
        groups.append(coords[:, a:a + 1].float() * freqs[None])
    ang = torch.cat(groups, dim=1)  # (n, head_dim/2)
    table = torch.stack([ang.cos(), ang.sin()], dim=-1)
    return torch.cat([torch.zeros(cls_token_num, head_dim // 2, 2), table])


class VideoGPT(GPT):
    """A :class:`vgen.interfaces.NextTokenModel` over a (t, h, w) token grid."""

    def __init__(self, config: VideoGPTConfig | None = None, **kwargs):
        super().__init__(config or VideoGPTConfig(**kwargs))

    def rope_table(self) -> torch.Tensor:
        cfg = self.config
        return rope_table_nd(cfg.latent_shape, cfg.head_dim, cfg.rope_base, cfg.cls_token_num)

    @property
    def token_shape(self) -> tuple[int, int, int]:
        return self.config.latent_shape


def infer_video_gpt(sd: dict) -> dict:
    cfg = infer_gpt(sd)
    cfg.pop("block_size", None)  # follows latent_shape
    return cfg


register_kind("video-gpt", VideoGPT, VideoGPTConfig, infer_video_gpt, is_gpt,
              "video GPT (LlamaGen GPT over (t, h, w) tokens, 3-D RoPE)", preset=gpt_preset,
              required=("n_head", "latent_shape"))
