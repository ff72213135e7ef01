"""LlamaGen's VQ image tokenizer (VQ-16 / VQ-8), with the official parameter names.

Encoder: conv_in, per level ``num_res_blocks`` residual blocks (+ self-attention at the lowest
resolution), a stride-2 conv between levels, a mid block (res, attn, res), GroupNorm + swish + conv_out.
Quantiser: nearest codebook entry, cosine (both sides l2-normalised) when ``codebook_l2_norm``.
Decoder: the mirror image with ``num_res_blocks + 1`` blocks per level and nearest-neighbour upsampling.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.models.loading import VQ_PRESETS, count_indexed, register_kind


@dataclass
class VQConfig:
    # Field names follow LlamaGen's tokenizer ModelArgs; ``ch`` and ``num_res_blocks`` are fixed
    # there (128 and 2) and configurable here.
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    codebook_l2_norm: bool = True
    codebook_show_usage: bool = True
    commit_loss_beta: float = 0.25
    entropy_loss_ratio: float = 0.0
    encoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    decoder_ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    z_channels: int = 256
    dropout_p: float = 0.0
    ch: int = 128
    num_res_blocks: int = 2

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)


def _norm(c: int) -> nn.GroupNorm:
    return nn.GroupNorm(32 if c % 32 == 0 else 1, c, eps=1e-6)


def _swish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, dropout: float = 0.0):
        super().__init__()
        self.norm1 = _norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2 = _norm(cout)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(_swish(self.norm1(x)))
        h = self.conv2(self.dropout(_swish(self.norm2(h))))
        if self.nin_shortcut is not None:
            x = self.nin_shortcut(x)
        return x + h


class AttnBlock(nn.Module):
    """Single-head spatial self-attention over all positions (1x1 conv projections)."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = _norm(c)
        self.q = nn.Conv2d(c, c, 1)
        self.k = nn.Conv2d(c, c, 1)
        self.v = nn.Conv2d(c, c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        hn = self.norm(x)
        q, k, v = (m(hn).flatten(2).transpose(1, 2)[:, None] for m in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)[:, 0]  # (b, hw, c)
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


def run_blocks(blocks: nn.ModuleList, attn: nn.ModuleList, h: torch.Tensor) -> torch.Tensor:
    """One level's residual blocks, each followed by its self-attention when the level has them."""
    for i, block in enumerate(blocks):
        h = block(h)
        if len(attn):
            h = attn[i](h)
    return h


class _Level(nn.Module):
    def __init__(self, cin, cout, n_blocks, attn, dropout, resample: str | None):
        super().__init__()
        self.res = nn.ModuleList()
        self.attn = nn.ModuleList()
        for _ in range(n_blocks):
            self.res.append(ResnetBlock(cin, cout, dropout))
            cin = cout
            if attn:
                self.attn.append(AttnBlock(cout))
        if resample == "down":
            self.downsample = Downsample(cout)
        elif resample == "up":
            self.upsample = Upsample(cout)

    def forward(self, h):
        h = run_blocks(self.res, self.attn, h)
        if hasattr(self, "downsample"):
            h = self.downsample(h)
        if hasattr(self, "upsample"):
            h = self.upsample(h)
        return h


class Downsample(nn.Module):
    """Stride-2 conv after a (0, 1, 0, 1) pad (the official taming/LDM downsample; VAR's VQVAE shares it)."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    """Nearest x2 then a 3x3 conv (the official taming/LDM upsample)."""

    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, 1, 1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


def _mid(c, dropout):
    return nn.ModuleList([ResnetBlock(c, c, dropout), AttnBlock(c), ResnetBlock(c, c, dropout)])


class Encoder(nn.Module):
    def __init__(self, ch, ch_mult, z_channels, num_res_blocks=2, dropout=0.0, in_channels=3):
        super().__init__()
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        n = len(ch_mult)
        widths = [ch] + [ch * m for m in ch_mult]
        self.conv_blocks = nn.ModuleList(
            _Level(widths[i], widths[i + 1], num_res_blocks, i == n - 1, dropout, "down" if i < n - 1 else None)
            for i in range(n))
        self.mid = _mid(widths[-1], dropout)
        self.norm_out = _norm(widths[-1])
        self.conv_out = nn.Conv2d(widths[-1], z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
        for m in self.mid:
            h = m(h)
        return self.conv_out(_swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, ch, ch_mult, z_channels, num_res_blocks=2, dropout=0.0, out_channels=3):
        super().__init__()
        n = len(ch_mult)
        block_in = ch * ch_mult[-1]
        self.conv_in = nn.Conv2d(z_channels, block_in, 3, 1, 1)
        self.mid = _mid(block_in, dropout)
        self.conv_blocks = nn.ModuleList()
        for i in reversed(range(n)):
            out = ch * ch_mult[i]
            self.conv_blocks.append(_Level(block_in, out, num_res_blocks + 1, i == n - 1, dropout,
                                           "up" if i > 0 else None))
            block_in = out
        self.norm_out = _norm(block_in)
        self.conv_out = nn.Conv2d(block_in, out_channels, 3, 1, 1)

    def forward(self, z):
        h = self.conv_in(z)
        for m in self.mid:
            h = m(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(_swish(self.norm_out(h)))


class VectorQuantizer(nn.Module):
    def __init__(self, n_e: int, e_dim: int, l2_norm: bool, show_usage: bool):
        super().__init__()
        self.n_e, self.e_dim, self.l2_norm = n_e, e_dim, l2_norm
        self.embedding = nn.Embedding(n_e, e_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_e, 1.0 / n_e)
        if l2_norm and not self.embedding.weight.is_meta:  # on meta (built to be loaded) only the shape is there
            self.embedding.weight.data = F.normalize(self.embedding.weight.data, dim=-1)
        if show_usage:  # kept for key compatibility with the official checkpoints
            self.register_buffer("codebook_used", torch.zeros(65536))

    def codebook(self) -> torch.Tensor:
        w = self.embedding.weight
        return F.normalize(w, dim=-1) if self.l2_norm else w

    def nearest(self, z: torch.Tensor) -> torch.Tensor:
        """z (..., e_dim) -> indices (...) of the nearest codebook entries."""
        flat = z.reshape(-1, self.e_dim)
        emb = self.codebook()
        if self.l2_norm:
            flat = F.normalize(flat, dim=-1)
        d = flat.pow(2).sum(1, keepdim=True) + emb.pow(2).sum(1) - 2 * flat @ emb.t()
        return d.argmin(1).view(z.shape[:-1])

    def lookup(self, idx: torch.Tensor) -> torch.Tensor:
        """indices (B, h, w) -> codes (B, e_dim, h, w)."""
        return self.codebook()[idx].permute(0, 3, 1, 2).contiguous()


class VQModel(nn.Module):
    """LlamaGen VQ tokenizer, a :class:`vgen.interfaces.Tokenizer`: ``encode(pixels) -> codes (B, h, w)``,
    ``decode(codes) -> pixels``."""

    def __init__(self, config: VQConfig | None = None, **kwargs):
        super().__init__()
        self.config = config = config or VQConfig(**kwargs)
        self.encoder = Encoder(config.ch, config.encoder_ch_mult, config.z_channels, config.num_res_blocks,
                               config.dropout_p)
        self.decoder = Decoder(config.ch, config.decoder_ch_mult, config.z_channels, config.num_res_blocks,
                               config.dropout_p)
        self.quantize = VectorQuantizer(config.codebook_size, config.codebook_embed_dim, config.codebook_l2_norm,
                                        config.codebook_show_usage)
        self.quant_conv = nn.Conv2d(config.z_channels, config.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(config.codebook_embed_dim, config.z_channels, 1)

    @property
    def codebook_size(self) -> int:
        return self.config.codebook_size

    def codebook(self) -> torch.Tensor:
        """The (codebook_size, e_dim) vectors codes decode from (l2-normalised when ``codebook_l2_norm``):
        the latent space where GSD and LANTERN measure how similar two tokens are."""
        return self.quantize.codebook().detach()

    def encode_latent(self, x: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] (B, 3, H, W) -> continuous pre-quantisation latents (B, e_dim, h, w)."""
        return self.quant_conv(self.encoder(x))

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] (B, 3, H, W) -> code indices on the token grid (B, h, w)."""
        return self.quantize.nearest(self.encode_latent(pixels).permute(0, 2, 3, 1))

    def encode_to_codes(self, x: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] (B, 3, H, W) -> code indices (B, h*w) in raster order."""
        return self.encode(x).flatten(1)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Code indices on the grid (B, h, w) -> images (B, 3, H, W), about [-1, 1], not clamped."""
        return self.decode_latent(self.quantize.lookup(tokens))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Flat code indices (B, h*w) of a square grid -> images (B, 3, H, W)."""
        s = int(round(codes.shape[1] ** 0.5))
        return self.decode(codes.view(codes.shape[0], s, s))

    def decode_latent(self, quant: torch.Tensor) -> torch.Tensor:
        """Quantised latents (B, e_dim, h, w) -> images (the official ``decode(quant)``)."""
        return self.decoder(self.post_quant_conv(quant))

    def decode_code(self, code_b: torch.Tensor, shape=None) -> torch.Tensor:
        """The official signature: ``shape = [B, e_dim, h, w]``."""
        if shape is None:
            return self.decode_codes(code_b.reshape(code_b.shape[0], -1))
        return self.decode(code_b.reshape(code_b.shape[0], shape[2], shape[3]))

    def forward(self, x: torch.Tensor):
        """Training forward: returns (reconstruction, quantised latent, pre-quant latent, indices)."""
        z = self.encode_latent(x)
        zp = z.permute(0, 2, 3, 1)
        idx = self.quantize.nearest(zp)
        if self.config.codebook_l2_norm:
            zp = F.normalize(zp, dim=-1)
        zq = self.quantize.codebook()[idx]
        zq_st = zp + (zq - zp).detach()  # straight-through
        rec = self.decode_latent(zq_st.permute(0, 3, 1, 2))
        return rec, zq, zp, idx

    def config_dict(self) -> dict:
        return asdict(self.config)


def infer_vq(sd: dict) -> dict:
    cfg: dict = {}
    if "quantize.embedding.weight" in sd:
        cfg["codebook_size"], cfg["codebook_embed_dim"] = sd["quantize.embedding.weight"].shape
    cfg["codebook_show_usage"] = "quantize.codebook_used" in sd
    if "quant_conv.weight" in sd:
        cfg["z_channels"] = sd["quant_conv.weight"].shape[1]
    if "encoder.conv_in.weight" in sd:
        ch = sd["encoder.conv_in.weight"].shape[0]
        cfg["ch"] = ch
        n = count_indexed(sd, "encoder.conv_blocks")
        mult = [sd[f"encoder.conv_blocks.{i}.res.0.conv1.weight"].shape[0] // ch for i in range(n)
                if f"encoder.conv_blocks.{i}.res.0.conv1.weight" in sd]
        if len(mult) == n and n:
            cfg["encoder_ch_mult"] = mult
        cfg["num_res_blocks"] = count_indexed(sd, "encoder.conv_blocks.0.res")
    if "decoder.conv_out.weight" in sd and "ch" in cfg:
        n = count_indexed(sd, "decoder.conv_blocks")
        key = "decoder.conv_blocks.{}.res.0.conv1.weight"
        mult = [sd[key.format(i)].shape[0] // cfg["ch"] for i in range(n) if key.format(i) in sd]
        if len(mult) == n and n:
            cfg["decoder_ch_mult"] = mult[::-1]
    return cfg


def is_vq(sd):
    return ("quantize.embedding.weight" in sd and "encoder.conv_in.weight" in sd and "quant_conv.weight" in sd
            and not any(k.startswith("encoder.down.") for k in sd))


def vq_preset(cfg: dict) -> str | None:
    return next((name for name, mult in VQ_PRESETS.items() if cfg.get("encoder_ch_mult") == mult), None)


register_kind("vq", VQModel, VQConfig, infer_vq, is_vq, "LlamaGen VQ tokenizer", preset=vq_preset)
