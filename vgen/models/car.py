"""CAR: a causal continuous-token AR model -- the "AR" variant of the MAR paper (causal attention in raster order,
a per-token diffusion head) built from vgen's LlamaGen blocks, so it has their static KV cache and 2D RoPE.

Token i is a float vector of ``token_channels`` values (a KL tokenizer's latent). The transformer reads
[class, projected tokens < i] and its normed hidden state ``z_i`` conditions MAR's diffusion head
(:class:`vgen.models.diffusion_head.DiffusionHead`, held as ``diffloss`` as in MAR), which draws token i. Because
attention is causal, the conditions of k drafted tokens come from one forward pass: the property continuous
speculative decoding (``cspd``) verifies with.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vgen.interfaces import Order, TokenType
from vgen.models.diffusion_head import DiffusionHead, HeadSampling
from vgen.models.gpt import GPT, GPTConfig, RMSNorm
from vgen.models.loading import count_indexed, register_kind


@dataclass
class CARConfig(GPTConfig):
    token_channels: int = 16          # MAR's vae_embed_dim
    diffloss_d: int = 3               # head depth (MAR-B: 6, MAR-L: 8, MAR-H: 12)
    diffloss_w: int = 1024            # head width (MAR-B: 1024, MAR-L: 1280, MAR-H: 1536)
    num_sampling_steps: int = 100     # respaced reverse steps when sampling (MAR's default)
    diffusion_batch_mul: int = 4      # each token's head loss is taken at this many timesteps per step (MAR)
    vocab_size: int = 0               # no vocabulary: tokens are latents


class CAR(HeadSampling, GPT):
    """A :class:`vgen.interfaces.ContinuousNextTokenModel`."""
    order = Order.CONTINUOUS_NEXT_TOKEN
    quantize_skip = ("diffloss", "tok_embeddings")  # quantize=: the diffusion head and the token projection stay in
    #                                                  float (their weights' dtype and device are read)

    def __init__(self, config: CARConfig | None = None, **kwargs):
        super().__init__(config or CARConfig(**kwargs))

    def build_embedding(self) -> nn.Module:
        return nn.Linear(self.config.token_channels, self.config.dim)

    def build_heads(self) -> None:
        cfg = self.config
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.diffloss = DiffusionHead(cfg.token_channels, cfg.dim, cfg.diffloss_d, cfg.diffloss_w,
                                      cfg.num_sampling_steps)

    def init_heads(self) -> None:
        self.diffloss.net.initialize_weights()  # MAR's head init (adaLN-zero), not the transformer's normal(0.02)

    def head(self, h):
        """Hidden states -> head conditions z (float32)."""
        return self.norm(h).float()

    @property
    def token_type(self) -> TokenType:
        return TokenType.latents(self.config.token_channels)

    @property
    def token_channels(self) -> int:
        return self.config.token_channels

    @property
    def num_sampling_steps(self) -> int:
        return self.config.num_sampling_steps

    @property
    def vocab_size(self) -> int:
        return 0

    def forward(self, tokens: torch.Tensor, cond: torch.Tensor, attn_mask: torch.Tensor | None = None):
        """Teacher forcing: tokens (B, L, C) -> head conditions (B, L, D); ``z[:, i]`` conditions token i."""
        return super().forward(tokens, cond, attn_mask)

    def loss(self, tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """MAR's diffusion loss over every token, each at ``diffusion_batch_mul`` random timesteps."""
        z = self(tokens, cond)
        m = self.config.diffusion_batch_mul
        target = tokens.reshape(-1, tokens.shape[-1]).repeat(m, 1)
        return self.diffloss.loss(target, z.reshape(-1, z.shape[-1]).repeat(m, 1))


def infer_car(sd: dict) -> dict:
    cfg: dict = {"n_layer": count_indexed(sd, "layers")}
    if "tok_embeddings.weight" in sd:
        cfg["dim"], cfg["token_channels"] = sd["tok_embeddings.weight"].shape
    if "cls_embedding.embedding_table.weight" in sd:
        cfg["num_classes"] = sd["cls_embedding.embedding_table.weight"].shape[0] - 1
    if "diffloss.net.input_proj.weight" in sd:
        cfg["diffloss_w"] = sd["diffloss.net.input_proj.weight"].shape[0]
        cfg["diffloss_d"] = count_indexed(sd, "diffloss.net.res_blocks")
    w1 = sd.get("layers.0.feed_forward.w1.weight")
    if w1 is not None and "dim" in cfg:
        from vgen.models.gpt import find_multiple
        if w1.shape[0] != find_multiple(int(8 * cfg["dim"] / 3), 256):
            cfg["ffn_dim_multiplier"] = w1.shape[0] / int(8 * cfg["dim"] / 3)
            cfg["multiple_of"] = 1
    return cfg


def is_car(sd: dict) -> bool:
    return "diffloss.net.input_proj.weight" in sd and "layers.0.attention.wqkv.weight" in sd


register_kind("car", CAR, CARConfig, infer_car, is_car, "causal continuous-token AR model (CAR)",
              required=("n_head", "block_size"))
