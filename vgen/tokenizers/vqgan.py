"""The decoder half of Chameleon's VQGAN (the image tokenizer Lumina-mGPT and Anole decode with), with the official
parameter names, read from Meta's released ``tokenizer/vqgan.ckpt`` unchanged.

transformers' ``ChameleonVQVAE`` keeps only the encoder; this is the other half. The architecture is taming's VQGAN
decoder: ``post_quant_conv`` (1x1, codebook width -> ``z_channels``), ``decoder.conv_in``, a mid block (res, attn,
res), per level from the coarsest ``num_res_blocks + 1`` residual blocks (+ self-attention at the resolutions the
config lists) and a nearest x2 upsample + 3x3 conv, then GroupNorm + swish + ``conv_out``. Every size is read from
the weights' shapes (no yaml needed); codes index ``quantize.embedding.weight``.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from vgen.errors import VGenError
from vgen.models.loading import count_indexed
from vgen.tokenizers.vq import AttnBlock, ResnetBlock, Upsample, run_blocks


class _Up(nn.Module):
    def __init__(self, cin: int, cout: int, n_blocks: int, attn: bool, upsample: bool):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout) for i in range(n_blocks))
        self.attn = nn.ModuleList(AttnBlock(cout) for _ in range(n_blocks if attn else 0))
        if upsample:
            self.upsample = Upsample(cout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = run_blocks(self.block, self.attn, h)
        return self.upsample(h) if hasattr(self, "upsample") else h


class _Mid(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = ResnetBlock(c, c), AttnBlock(c), ResnetBlock(c, c)


class Decoder(nn.Module):
    """taming's VQGAN decoder: ``widths[i]`` channels at level i (finest first), ``attn_levels`` the levels with
    self-attention after each residual block."""

    def __init__(self, widths: list[int], z_channels: int, num_res_blocks: int, attn_levels: set[int],
                 out_channels: int = 3):
        super().__init__()
        n = len(widths)
        self.conv_in = nn.Conv2d(z_channels, widths[-1], 3, 1, 1)
        self.mid = _Mid(widths[-1])
        # up[i] is level i (finest first), run from the coarsest: the official order and names
        self.up = nn.ModuleList(_Up(widths[min(i + 1, n - 1)], widths[i], num_res_blocks + 1, i in attn_levels, i > 0)
                                for i in range(n))
        self.norm_out = nn.GroupNorm(32, widths[0], eps=1e-6)
        self.conv_out = nn.Conv2d(widths[0], out_channels, 3, 1, 1)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(z)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        for level in reversed(self.up):
            h = level(h)
        h = self.norm_out(h)
        return self.conv_out(h * torch.sigmoid(h))


class VQGANDecoder(nn.Module):
    """Codes (B, h, w) -> pixels in about [-1, 1] (B, 3, h * f, w * f), f = 2 ** (levels - 1) (16 for Chameleon)."""

    def __init__(self, n_codes: int, embed_dim: int, widths: list[int], z_channels: int, num_res_blocks: int,
                 attn_levels: set[int]):
        super().__init__()
        self.quantize = nn.Module()
        self.quantize.embedding = nn.Embedding(n_codes, embed_dim)
        self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        self.decoder = Decoder(widths, z_channels, num_res_blocks, attn_levels)

    @property
    def codebook_size(self) -> int:
        return self.quantize.embedding.num_embeddings

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.decoder.up) - 1)

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        if codes.dim() != 3:
            raise VGenError(f"decode_codes takes codes (B, h, w), got shape {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise VGenError(f"codes must be in 0..{self.codebook_size - 1}")
        z = self.quantize.embedding(codes).permute(0, 3, 1, 2)
        return self.decoder(self.post_quant_conv(z))

    @classmethod
    def from_state_dict(cls, sd: dict[str, torch.Tensor], where: str = "the VQGAN weights") -> VQGANDecoder:
        """The decoder from a VQGAN state dict (the full model's; encoder keys are ignored), sizes from shapes."""
        need = ("quantize.embedding.weight", "post_quant_conv.weight", "decoder.conv_in.weight",
                "decoder.conv_out.weight")
        missing = [k for k in need if k not in sd]
        if missing:
            raise VGenError(f"{where} is not a VQGAN: it lacks {', '.join(missing)} (Chameleon's tokenizer/vqgan.ckpt "
                            "has them)")
        n = count_indexed(sd, "decoder.up")
        widths = [int(sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0]) for i in range(n)]
        attn = {i for i in range(n) if f"decoder.up.{i}.attn.0.q.weight" in sd}
        n_codes, embed_dim = sd["quantize.embedding.weight"].shape
        z = int(sd["decoder.conv_in.weight"].shape[1])
        dec = cls(int(n_codes), int(embed_dim), widths, z, count_indexed(sd, "decoder.up.0.block") - 1, attn)
        keep = {k: v for k, v in sd.items() if k.startswith(("decoder.", "post_quant_conv.", "quantize.embedding."))}
        try:
            dec.load_state_dict(keep)
        except RuntimeError as e:
            raise VGenError(f"{where} does not match taming's VQGAN decoder: {str(e).splitlines()[0]}") from None
        return dec.eval()


def load_vqgan(path, device="cpu", dtype=None) -> VQGANDecoder:
    """Chameleon's VQGAN decoder from ``vqgan.ckpt`` (Meta's release: a ``state_dict`` of tensors, read with
    ``weights_only=True``) or a ``.safetensors`` file of the same keys."""
    path = Path(path)
    if not path.is_file():
        raise VGenError(f"no VQGAN file at {path}: Chameleon's decoder is tokenizer/vqgan.ckpt of Meta's Chameleon "
                        "release (Lumina-mGPT reads it from ckpts/chameleon/tokenizer/)")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file
        sd = load_file(str(path))
    else:
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - pickled objects beyond tensors
            raise VGenError(f"{path} holds more than tensors ({type(e).__name__}): vgen reads checkpoints with "
                            "weights_only=True; save its state_dict alone (or as .safetensors) and load that") from None
        sd = sd.get("state_dict", sd) if isinstance(sd, dict) else sd
    if not isinstance(sd, dict):
        raise VGenError(f"{path} holds a {type(sd).__name__}, not a state dict")
    dec = VQGANDecoder.from_state_dict(sd, str(path))
    return dec.to(device=device, dtype=dtype or torch.float32)


__all__ = ["Decoder", "VQGANDecoder", "load_vqgan"]
