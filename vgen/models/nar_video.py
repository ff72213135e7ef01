"""NAR for video (ThisisBillhe/NAR ``NAR-videos``, built on LARP-AR): next-neighbour heads on a (t, h, w) grid.

Parameter names and config fields are the official ``LARP_AR`` / ``ModelArgs`` ones, so the released video
checkpoints load unchanged (``load_official("nar-video", path)``). The network is LlamaGen's block stack
(fused ``wqkv``, SwiGLU, RMSNorm, no biases) with **learned absolute positions** instead of RoPE
(``abs_pe`` (1, cls_token_num + T*H*W, dim), row j added to sequence position j) and
``n_layer + attn_num_back + attn_num_down`` blocks feeding three heads:

* right (``norm_R`` / ``output_R``), after block ``n_layer - 1``: predicts (t, h, w + 1);
* down (``norm_D`` / ``output_D``), after block ``n_layer + attn_num_back - 1``: predicts (t, h + 1, w);
* back, the time head (``norm_B`` / ``output_B``), after the last block: predicts (t + 1, h, w).

(The official names: B is the time axis, D the height axis.) Everything else is the NAR model's: the proximity
mask over planes t + h + w, each token's logits the mean of the heads that reach it, T + H + W - 2 forward
passes with the ``nar`` sampler.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from vgen.interfaces import Order
from vgen.models.gpt import GPTConfig, find_multiple
from vgen.models.loading import count_indexed, register_kind
from vgen.models.nar import NAR


@dataclass
class NARVideoConfig(GPTConfig):
    # the official ModelArgs defaults (LARP-AR) where they differ from LlamaGen's
    num_classes: int = 101
    model_type: str = "class_cond"
    vocab_size: int = 8192
    max_seq_len: int = 1024
    latent_shape: tuple = (4, 16, 16)  # (T, H, W): the token grid; max_seq_len must equal T*H*W
    attn_num_back: int = 1             # blocks between the right head and the down head
    attn_num_down: int = 1             # blocks between the down head and the time head
    use_fixed_pe: bool = False         # 1-D sincos positions in a buffer instead of learned ones
    frame_prediction: bool = False     # condition frames as tokens (not supported)

    def __post_init__(self):
        self.latent_shape = tuple(int(s) for s in self.latent_shape)
        if len(self.latent_shape) != 3 or min(self.latent_shape) < 1:
            raise ValueError(f"latent_shape is the (T, H, W) token grid, got {self.latent_shape}")
        if self.max_seq_len != math.prod(self.latent_shape):
            raise ValueError(f"max_seq_len must equal T*H*W = {math.prod(self.latent_shape)} for latent_shape "
                             f"{list(self.latent_shape)}, got {self.max_seq_len}")
        if self.frame_prediction:
            raise ValueError("frame_prediction=True (condition frames as tokens) is not supported: use the "
                             "class-conditional model with prompt frames (vgen sample prompt=...)")
        self.block_size = self.max_seq_len


def sincos_positions(n: int, dim: int) -> torch.Tensor:
    """(n, dim) fixed 1-D positions: sines of position * omega in the first half, cosines in the second."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2.0))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * omega[None]
    return torch.cat([ang.sin(), ang.cos()], dim=1).float()


class NARVideo(NAR):
    """A :class:`vgen.interfaces.NextNeighbourModel` over a (t, h, w) token grid."""
    order = Order.NEXT_NEIGHBOUR
    heads = (((0, 0, 1), "norm_R", "output_R"),   # right, after the base layers
             ((0, 1, 0), "norm_D", "output_D"),   # down, after attn_num_back more blocks
             ((1, 0, 0), "norm_B", "output_B"))   # next frame, after the last block

    def __init__(self, config: NARVideoConfig | None = None, **kwargs):
        cfg = config or NARVideoConfig(**kwargs)
        if cfg.attn_num_back < 1 or cfg.attn_num_down < 1:
            raise ValueError("attn_num_back and attn_num_down must be >= 1 (each head reads after its own blocks)")
        super().__init__(cfg)
        n = cfg.cls_token_num + cfg.max_seq_len
        if cfg.use_fixed_pe:
            self.register_buffer("abs_pe", sincos_positions(n, cfg.dim)[None])
        else:
            self.abs_pe = nn.Parameter(torch.randn(1, n, cfg.dim) * 0.02)

    @staticmethod
    def extra_blocks(cfg) -> int:
        return cfg.attn_num_back + cfg.attn_num_down

    def init_heads(self) -> None:
        for _, _, out in self.heads:  # the official init zeroes all three heads
            nn.init.zeros_(getattr(self, out).weight)

    def head_blocks(self) -> tuple[int, ...]:
        n = self.config.n_layer
        return n - 1, n + self.config.attn_num_back - 1, len(self.layers) - 1

    def rope_table(self) -> torch.Tensor:
        return torch.zeros(0)  # no rotary positions

    def positions(self, h, input_pos):
        return h + self.abs_pe[0, input_pos].to(h.dtype), None

    @property
    def token_shape(self) -> tuple[int, int, int]:
        return self.config.latent_shape


def infer_nar_video(sd: dict) -> dict:
    """The shapes give vocab, dim, the block count and cls_token_num + T*H*W (from ``abs_pe``); the grid, the
    head count and how the blocks split are not in the shapes (the official defaults of one block per extra
    head are assumed; latent_shape and n_head must come from the file's metadata or the caller)."""
    cfg: dict = {}
    if "tok_embeddings.weight" in sd:
        cfg["vocab_size"], cfg["dim"] = sd["tok_embeddings.weight"].shape
    blocks = count_indexed(sd, "layers")
    if blocks:
        cfg["n_layer"] = blocks - 2
        cfg["attn_num_back"], cfg["attn_num_down"] = 1, 1
    if "cls_embedding.embedding_table.weight" in sd:
        cfg["num_classes"] = sd["cls_embedding.embedding_table.weight"].shape[0] - 1
    if "abs_pe" in sd:
        cfg["max_seq_len"] = sd["abs_pe"].shape[1] - 1
    w1 = sd.get("layers.0.feed_forward.w1.weight")
    if w1 is not None and "dim" in cfg and w1.shape[0] != find_multiple(int(8 * cfg["dim"] / 3), 256):
        cfg["ffn_dim_multiplier"] = w1.shape[0] / int(8 * cfg["dim"] / 3)
        cfg["multiple_of"] = 1
    return cfg


def is_nar_video(sd) -> bool:
    return "output_B.weight" in sd and "abs_pe" in sd


def split_video_blocks(cfg: dict, inferred: dict, given: dict) -> dict:
    """The shapes give n_layer + attn_num_back + attn_num_down blocks in all: split them as asked."""
    if "n_layer" not in given and inferred.get("n_layer"):
        total = inferred["n_layer"] + 2
        cfg["n_layer"] = total - cfg.get("attn_num_back", 1) - cfg.get("attn_num_down", 1)
    return cfg


register_kind("nar-video", NARVideo, NARVideoConfig, infer_nar_video, is_nar_video,
              "NAR video model (LARP-AR with right, down and time heads)", finalize=split_video_blocks,
              required=("n_head", "latent_shape"))
