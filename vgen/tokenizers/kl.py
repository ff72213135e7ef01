"""KL tokenizer: diffusers' ``AutoencoderKL`` as a continuous tokenizer (the tokenizer of MAR-style models).

Pixels in [-1, 1] (B, 3, H, W) -> latent tokens (B, h, w, C), channels last so that token i of a flat raster sequence
is one C-vector; ``tokens = (z - shift_factor) * scaling_factor`` with ``z`` the posterior's mean (``encode``) or a
draw from it (``encode(..., sample=True)``, MAR's training input). ``decode`` inverts the scaling and runs the
decoder.

The state dict is the diffusers ``AutoencoderKL`` layout under ``vae.``; ``load_official("kl", ...)`` also takes a
plain diffusers checkpoint and the original LDM / MAR layout (``encoder.down.0.block.0...``, as MAR's ``kl16.ckpt``),
converted with diffusers' own converter.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from vgen.errors import VGenError
from vgen.models.loading import count_indexed, register_kind


@dataclass
class KLConfig:
    latent_channels: int = 4
    block_out_channels: list = field(default_factory=lambda: [32, 64, 64])  # one downsample between levels
    layers_per_block: int = 1
    norm_num_groups: int = 32
    mid_block_add_attention: bool = True
    scaling_factor: float = 1.0  # tokens = (z - shift_factor) * scaling_factor (measured on the training latents)
    shift_factor: float = 0.0
    image_size: int = 64

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.block_out_channels) - 1)


class KLTokenizer(nn.Module):
    """A diffusers ``AutoencoderKL`` with vgen's tokenizer interface (``encode``/``decode`` on token grids)."""

    def __init__(self, config: KLConfig):
        super().__init__()
        from diffusers import AutoencoderKL
        self.config = config
        n = len(config.block_out_channels)
        self.vae = AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * n,
            up_block_types=("UpDecoderBlock2D",) * n, block_out_channels=tuple(config.block_out_channels),
            layers_per_block=config.layers_per_block, latent_channels=config.latent_channels,
            norm_num_groups=config.norm_num_groups, sample_size=config.image_size,
            scaling_factor=config.scaling_factor, shift_factor=config.shift_factor,
            mid_block_add_attention=config.mid_block_add_attention)

    @property
    def latent_channels(self) -> int:
        return self.config.latent_channels

    @property
    def downsample(self) -> int:
        return self.config.downsample

    def posterior(self, pixels: torch.Tensor):
        return self.vae.encode(pixels).latent_dist

    def to_tokens(self, z: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) latents -> (B, h, w, C) scaled tokens."""
        return ((z - self.config.shift_factor) * self.config.scaling_factor).permute(0, 2, 3, 1)

    def encode(self, pixels: torch.Tensor, sample: bool = False,
               generator: torch.Generator | None = None) -> torch.Tensor:
        post = self.posterior(pixels)
        return self.to_tokens(post.sample(generator) if sample else post.mode())

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, h, w, C) tokens (or flat (B, h*w, C) for a square grid) -> pixels (B, 3, H, W), not clamped."""
        if tokens.dim() == 3:
            side = int(round(tokens.shape[1] ** 0.5))
            tokens = tokens.reshape(tokens.shape[0], side, side, tokens.shape[2])
        z = tokens.permute(0, 3, 1, 2) / self.config.scaling_factor + self.config.shift_factor
        return self.vae.decode(z.to(next(self.parameters()).dtype)).sample

    def forward(self, pixels: torch.Tensor, generator: torch.Generator | None = None):
        """Training forward: (reconstruction, posterior)."""
        post = self.posterior(pixels)
        return self.vae.decode(post.sample(generator)).sample, post

    def config_dict(self) -> dict:
        return asdict(self.config)


# ---- loading --------------------------------------------------------------------------------------------------
def _is_ldm(sd: dict) -> bool:
    return any(k.startswith("encoder.down.") for k in sd) and "quant_conv.weight" in sd


def _is_diffusers(sd: dict) -> bool:
    return any(k.startswith("encoder.down_blocks.") for k in sd) and "quant_conv.weight" in sd


def convert_kl(sd: dict) -> dict:
    """LDM / MAR (``encoder.down.0...``) or plain diffusers keys -> this module's (``vae.`` + diffusers)."""
    if any(k.startswith("vae.") for k in sd):
        return sd
    if _is_ldm(sd):
        from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
        inner = [k for k in sd if (k.startswith("encoder.down.") or k.startswith("decoder.up.")) and ".attn." in k]
        if inner:
            raise VGenError(f"this KL checkpoint has attention inside its resolution levels ({inner[0]}: LDM's "
                            "attn_resolutions), which diffusers' AutoencoderKL cannot express; only its middle "
                            "block has attention. Load it with the code it was trained with")
        n = count_indexed(sd, "encoder.down")
        sd = convert_ldm_vae_checkpoint({k: v for k, v in sd.items() if not k.startswith("loss.")},
                                        {"down_block_types": ["DownEncoderBlock2D"] * n,
                                         "up_block_types": ["UpDecoderBlock2D"] * n})
    return {f"vae.{k}": v for k, v in sd.items()}


def infer_kl(sd: dict) -> dict:
    sd = convert_kl(sd)
    cfg: dict = {}
    if "vae.quant_conv.weight" in sd:
        cfg["latent_channels"] = sd["vae.quant_conv.weight"].shape[0] // 2
    n = count_indexed(sd, "vae.encoder.down_blocks")
    if n:
        cfg["block_out_channels"] = [sd[f"vae.encoder.down_blocks.{i}.resnets.0.conv1.weight"].shape[0]
                                     for i in range(n)]
        cfg["layers_per_block"] = count_indexed(sd, "vae.encoder.down_blocks.0.resnets")
    cfg["mid_block_add_attention"] = any(k.startswith("vae.encoder.mid_block.attentions.") for k in sd)
    return cfg


def is_kl(sd: dict) -> bool:
    return ((_is_ldm(sd) or _is_diffusers(sd) or "vae.quant_conv.weight" in sd)
            and not any(k.startswith("quantize.") for k in sd))


register_kind("kl", KLTokenizer, KLConfig, infer_kl, is_kl,
              "KL autoencoder (diffusers AutoencoderKL; LDM / MAR KL layouts convert)", convert=convert_kl)
