"""VAR's multi-scale VQVAE (FoundationVision/VAR ``models/vqvae.py``), with the official parameter names so the
released ``vae_ch160v4096z32.pth`` loads strictly.

An image becomes a pyramid of token maps (``v_patch_nums``, e.g. 1, 2, 3, ..., 16): each scale quantises what
the coarser scales left unexplained (residual quantisation), and the sum of the upsampled, phi-refined code
maps (``f_hat``) is decoded. Lookup is plain L2 (cosine with ``using_znorm``). The codes of all scales,
concatenated coarse to fine, are one ``(B, L)`` token row: what a next-scale model predicts.

Differences from the official class, all opt-in: ``ch_mult``, ``num_res_blocks`` and attention are
configurable (the official encoder is fixed at (1, 1, 2, 2, 4), two blocks, attention on), so small zoo
tokenizers share the code path.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.models.loading import count_indexed, register_kind
from vgen.tokenizers.vq import Downsample, Upsample


@dataclass
class MSVQConfig:
    vocab_size: int = 4096
    z_channels: int = 32  # Cvae
    ch: int = 160
    ch_mult: list[int] = field(default_factory=lambda: [1, 1, 2, 2, 4])
    num_res_blocks: int = 2
    using_sa: bool = True
    using_mid_sa: bool = True
    dropout: float = 0.0
    beta: float = 0.25
    using_znorm: bool = False
    quant_conv_ks: int = 3
    quant_resi: float = 0.5
    share_quant_resi: int = 4
    default_qresi_counts: int = 0
    v_patch_nums: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 8, 10, 13, 16])

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def _norm(c):
    return nn.GroupNorm(32 if c % 32 == 0 else _groups(c), c, eps=1e-6)


def _groups(c):
    for g in (32, 16, 8, 4, 2, 1):
        if c % g == 0:
            return g
    return 1


class ResnetBlock(nn.Module):
    def __init__(self, cin, cout, dropout=0.0):
        super().__init__()
        self.norm1, self.conv1 = _norm(cin), nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2, self.conv2 = _norm(cout), nn.Conv2d(cout, cout, 3, 1, 1)
        self.dropout = nn.Dropout(dropout) if dropout > 1e-6 else nn.Identity()
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(self.dropout(F.silu(self.norm2(h))))
        return self.nin_shortcut(x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the pixels of a feature map (fused 1x1 ``qkv``)."""

    def __init__(self, c):
        super().__init__()
        self.norm = _norm(c)
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj_out = nn.Conv2d(c, c, 1)

    def forward(self, x):
        B, C, H, W = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(B, 3, C, H * W).unbind(1)
        w = torch.softmax(q.transpose(1, 2) @ k * C ** -0.5, dim=-1)  # (B, HW_q, HW_k)
        h = (v @ w.transpose(1, 2)).view(B, C, H, W)
        return x + self.proj_out(h)


def _mid(c, dropout, attn):
    m = nn.Module()
    m.block_1 = ResnetBlock(c, c, dropout)
    m.attn_1 = AttnBlock(c) if attn else nn.Identity()
    m.block_2 = ResnetBlock(c, c, dropout)
    return m


class Encoder(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        ch, mult, n = cfg.ch, cfg.ch_mult, cfg.num_res_blocks
        self.conv_in = nn.Conv2d(3, ch, 3, 1, 1)
        self.down = nn.ModuleList()
        cin = ch
        for i, m in enumerate(mult):
            lvl = nn.Module()
            lvl.block, lvl.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(n):
                lvl.block.append(ResnetBlock(cin, ch * m, cfg.dropout))
                cin = ch * m
                if i == len(mult) - 1 and cfg.using_sa:
                    lvl.attn.append(AttnBlock(cin))
            if i != len(mult) - 1:
                lvl.downsample = Downsample(cin)
            self.down.append(lvl)
        self.mid = _mid(cin, cfg.dropout, cfg.using_mid_sa)
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, cfg.z_channels, 3, 1, 1)

    def forward(self, x):
        h = self.conv_in(x)
        for i, lvl in enumerate(self.down):
            for j, blk in enumerate(lvl.block):
                h = blk(h)
                if len(lvl.attn):
                    h = lvl.attn[j](h)
            if i != len(self.down) - 1:
                h = lvl.downsample(h)
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h)))
        return self.conv_out(F.silu(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        ch, mult, n = cfg.ch, cfg.ch_mult, cfg.num_res_blocks
        cin = ch * mult[-1]
        self.conv_in = nn.Conv2d(cfg.z_channels, cin, 3, 1, 1)
        self.mid = _mid(cin, cfg.dropout, cfg.using_mid_sa)
        ups = []
        for i in reversed(range(len(mult))):
            lvl = nn.Module()
            lvl.block, lvl.attn = nn.ModuleList(), nn.ModuleList()
            for _ in range(n + 1):
                lvl.block.append(ResnetBlock(cin, ch * mult[i], cfg.dropout))
                cin = ch * mult[i]
                if i == len(mult) - 1 and cfg.using_sa:
                    lvl.attn.append(AttnBlock(cin))
            if i != 0:
                lvl.upsample = Upsample(cin)
            ups.insert(0, lvl)
        self.up = nn.ModuleList(ups)  # index = resolution level, as in the official checkpoints
        self.norm_out = _norm(cin)
        self.conv_out = nn.Conv2d(cin, 3, 3, 1, 1)

    def forward(self, z):
        h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(self.conv_in(z))))
        for i in reversed(range(len(self.up))):
            lvl = self.up[i]
            for j, blk in enumerate(lvl.block):
                h = blk(h)
                if len(lvl.attn):
                    h = lvl.attn[j](h)
            if i != 0:
                h = lvl.upsample(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Phi(nn.Conv2d):
    """phi(h) = (1 - r) h + r conv3x3(h): the refinement applied to each upsampled code map."""

    def __init__(self, c: int, ratio: float):
        super().__init__(c, c, 3, 1, 1)
        self.ratio = abs(ratio)

    def forward(self, h):
        return h * (1 - self.ratio) + super().forward(h) * self.ratio


class _PhiShared(nn.Module):
    def __init__(self, phi):
        super().__init__()
        self.qresi = phi

    def pick(self, at: float):
        return self.qresi


class _PhiPartiallyShared(nn.Module):
    def __init__(self, phis):
        super().__init__()
        self.qresi_ls = nn.ModuleList(phis)
        self.ticks = _ticks(len(phis))

    def pick(self, at: float):
        return self.qresi_ls[int(np.argmin(np.abs(self.ticks - at)))]


class _PhiNonShared(nn.ModuleList):
    def __init__(self, phis):
        super().__init__(phis)
        self.ticks = _ticks(len(phis))

    def pick(self, at: float):
        return self[int(np.argmin(np.abs(self.ticks - at)))]


def _ticks(k: int) -> np.ndarray:
    # the official placement of k shared phi layers on [0, 1] (scale index / (number of scales - 1))
    return np.linspace(1 / 3 / k, 1 - 1 / 3 / k, k) if k == 4 else np.linspace(1 / 2 / k, 1 - 1 / 2 / k, k)


class MultiScaleQuantizer(nn.Module):
    def __init__(self, cfg: MSVQConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.Cvae, self.patch_nums = cfg.vocab_size, cfg.z_channels, list(cfg.v_patch_nums)

        def make():
            return Phi(cfg.z_channels, cfg.quant_resi) if abs(cfg.quant_resi) > 1e-6 else nn.Identity()
        if cfg.share_quant_resi == 0:
            self.quant_resi = _PhiNonShared([make() for _ in range(cfg.default_qresi_counts or len(self.patch_nums))])
        elif cfg.share_quant_resi == 1:
            self.quant_resi = _PhiShared(make())
        else:
            self.quant_resi = _PhiPartiallyShared([make() for _ in range(cfg.share_quant_resi)])
        # usage statistics of the official training (kept so released files load strictly; unused here)
        self.register_buffer("ema_vocab_hit_SV", torch.zeros(len(self.patch_nums), cfg.vocab_size))
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.z_channels)

    def phi(self, si: int) -> nn.Module:
        n = len(self.patch_nums)
        return self.quant_resi.pick(si / (n - 1) if n > 1 else 0.0)

    def nearest(self, z_NC: torch.Tensor) -> torch.Tensor:
        w = self.embedding.weight
        if self.cfg.using_znorm:
            return torch.argmax(F.normalize(z_NC, dim=-1) @ F.normalize(w, dim=-1).T, dim=1)
        d = z_NC.square().sum(1, keepdim=True) + w.square().sum(1) - 2 * z_NC @ w.T
        return torch.argmin(d, dim=1)

    def upsampled(self, si: int, h_BChw: torch.Tensor, H: int, W: int) -> torch.Tensor:
        """A scale's code map brought to the last scale's size and refined by its phi."""
        if si != len(self.patch_nums) - 1:
            h_BChw = F.interpolate(h_BChw, size=(H, W), mode="bicubic")
        return self.phi(si)(h_BChw)

    def quantize(self, f: torch.Tensor, with_loss: bool = False):
        """Residual multi-scale quantisation of f (B, C, H, W): per-scale indices (B, pn*pn), f_hat, and (if
        asked) VAR's VQ loss (commitment beta * |sg(f_hat) - f|^2 + |f_hat - sg(f)|^2, averaged over scales)."""
        B, C, H, W = f.shape
        if (H, W) != (self.patch_nums[-1],) * 2:
            raise VGenError(f"latent of {H}x{W} does not match the last scale {self.patch_nums[-1]}: images must be "
                            f"{self.patch_nums[-1]} x the tokenizer's downsampling factor")
        f_nograd = f.detach().float()
        rest = f_nograd.clone()
        f_hat = torch.zeros_like(rest)
        idx, loss, queried = [], 0.0, []
        n = len(self.patch_nums)
        for si, pn in enumerate(self.patch_nums):
            z = F.interpolate(rest, size=(pn, pn), mode="area") if si != n - 1 else rest
            i_N = self.nearest(z.permute(0, 2, 3, 1).reshape(-1, C))
            h = self.embedding(i_N.view(B, pn, pn)).permute(0, 3, 1, 2)
            h = self.upsampled(si, h, H, W)
            f_hat = f_hat + h
            rest = rest - h.detach() if with_loss else rest - h
            idx.append(i_N.view(B, pn * pn))
            if with_loss:
                queried.append(z.permute(0, 2, 3, 1).reshape(-1, C))
                loss = loss + self.cfg.beta * F.mse_loss(f_hat.detach(), f.float()) + F.mse_loss(f_hat, f_nograd)
        if with_loss:
            f_hat = (f_hat.detach() - f_nograd) + f.float()  # straight-through to the encoder
            self.last_queried = torch.cat(queried)  # the residuals each scale looked up (dead-code restarts)
            return idx, f_hat, loss / n
        return idx, f_hat

    def split(self, codes: torch.Tensor) -> list[torch.Tensor]:
        L = sum(p * p for p in self.patch_nums)
        if codes.shape[-1] != L:
            raise VGenError(f"got {codes.shape[-1]} tokens per image; this multi-scale tokenizer expects {L} "
                            f"(scales {self.patch_nums})")
        return list(codes.split([p * p for p in self.patch_nums], dim=-1))

    def codes_to_fhat(self, idx: list[torch.Tensor]) -> torch.Tensor:
        B, P = idx[0].shape[0], self.patch_nums[-1]
        f_hat = self.embedding.weight.new_zeros(B, self.Cvae, P, P)
        for si, (i_Bl, pn) in enumerate(zip(idx, self.patch_nums)):
            h = self.embedding(i_Bl).transpose(1, 2).reshape(B, self.Cvae, pn, pn)
            f_hat = f_hat + self.upsampled(si, h, P, P)
        return f_hat

    def next_input(self, si: int, f_hat: torch.Tensor, idx_Bl: torch.Tensor):
        """Inference step of a next-scale model: add scale ``si``'s codes to f_hat; return (f_hat, the next
        scale's input (B, pn_next^2, Cvae), or None after the last scale)."""
        B, pn, P = idx_Bl.shape[0], self.patch_nums[si], self.patch_nums[-1]
        h = self.embedding(idx_Bl).transpose(1, 2).reshape(B, self.Cvae, pn, pn)
        f_hat = f_hat + self.upsampled(si, h, P, P)
        if si == len(self.patch_nums) - 1:
            return f_hat, None
        nxt = self.patch_nums[si + 1]
        return f_hat, F.interpolate(f_hat, size=(nxt, nxt), mode="area").flatten(2).transpose(1, 2)

    def teacher_input(self, idx: list[torch.Tensor]) -> torch.Tensor:
        """Teacher-forcing input of a next-scale model (B, L - first scale, Cvae): for every scale after the
        first, f_hat of the coarser scales area-downsampled to that scale."""
        f_hat = self.embedding.weight.new_zeros(idx[0].shape[0], self.Cvae, self.patch_nums[-1], self.patch_nums[-1])
        out = []
        for si in range(len(self.patch_nums) - 1):
            f_hat, nxt = self.next_input(si, f_hat, idx[si])
            out.append(nxt)
        return torch.cat(out, dim=1)


class MultiScaleVQVAE(nn.Module):
    """VAR's multi-scale VQVAE, a :class:`vgen.interfaces.Tokenizer` over the flat pyramid of codes (B, L)."""

    def __init__(self, config: MSVQConfig | None = None, **kwargs):
        super().__init__()
        self.config = config or MSVQConfig(**kwargs)
        self.encoder = Encoder(self.config)
        self.decoder = Decoder(self.config)
        self.quantize = MultiScaleQuantizer(self.config)
        ks = self.config.quant_conv_ks
        self.quant_conv = nn.Conv2d(self.config.z_channels, self.config.z_channels, ks, 1, ks // 2)
        self.post_quant_conv = nn.Conv2d(self.config.z_channels, self.config.z_channels, ks, 1, ks // 2)

    @property
    def codebook_size(self) -> int:
        return self.config.vocab_size

    @property
    def patch_nums(self) -> list[int]:
        return list(self.config.v_patch_nums)

    @property
    def seq_len(self) -> int:
        return sum(p * p for p in self.patch_nums)

    def codebook(self) -> torch.Tensor:
        """(V, Cvae) code vectors (the space token-similarity samplers measure distances in)."""
        return self.quantize.embedding.weight.detach()

    def encode_scales(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Images in [-1, 1] -> per-scale indices, coarse to fine (official ``img_to_idxBl``)."""
        return self.quantize.quantize(self.quant_conv(self.encoder(x)))[0]

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """Images in [-1, 1] -> the flat pyramid of codes (B, L), coarse to fine."""
        return torch.cat(self.encode_scales(pixels), dim=1)

    def encode_to_codes(self, x: torch.Tensor) -> torch.Tensor:
        """Alias of ``encode`` (the pyramid is already flat), as the single-scale tokenizer names it."""
        return self.encode(x)

    def fhat_to_img(self, f_hat: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(f_hat)).clamp(-1, 1)

    def decode_scales(self, idx: list[torch.Tensor]) -> torch.Tensor:
        """Per-scale indices -> image in [-1, 1] (official ``idxBl_to_img(..., same_shape=True, last_one=True)``)."""
        return self.fhat_to_img(self.quantize.codes_to_fhat(idx))

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L) tokens of all scales, coarse to fine -> images in [-1, 1]."""
        return self.decode_scales(self.quantize.split(tokens))

    def decode_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """Alias of ``decode``, as the single-scale tokenizer names its flat-codes decoder."""
        return self.decode(codes)

    def forward(self, x: torch.Tensor):
        """Training: (reconstruction, VQ loss, per-scale indices)."""
        idx, f_hat, loss = self.quantize.quantize(self.quant_conv(self.encoder(x)), with_loss=True)
        return self.decoder(self.post_quant_conv(f_hat)), loss, idx

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        # as the official class: usage statistics recorded for another number of scales are not an error
        key = "quantize.ema_vocab_hit_SV"
        if key in state_dict and state_dict[key].shape != self.quantize.ema_vocab_hit_SV.shape:
            state_dict = {**state_dict, key: self.quantize.ema_vocab_hit_SV}
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def config_dict(self) -> dict:
        return dataclasses.asdict(self.config)


def infer_msvq(sd: dict) -> dict:
    cfg: dict = {}
    if "quantize.embedding.weight" in sd:
        cfg["vocab_size"], cfg["z_channels"] = sd["quantize.embedding.weight"].shape
    if "encoder.conv_in.weight" in sd:
        ch = cfg["ch"] = sd["encoder.conv_in.weight"].shape[0]
        n = count_indexed(sd, "encoder.down")
        key = "encoder.down.{}.block.0.conv1.weight"
        if n and all(key.format(i) in sd for i in range(n)):
            cfg["ch_mult"] = [sd[key.format(i)].shape[0] // ch for i in range(n)]
        cfg["num_res_blocks"] = count_indexed(sd, "encoder.down.0.block")
        cfg["using_sa"] = f"encoder.down.{max(n - 1, 0)}.attn.0.qkv.weight" in sd
        cfg["using_mid_sa"] = "encoder.mid.attn_1.qkv.weight" in sd
    if "quant_conv.weight" in sd:
        cfg["quant_conv_ks"] = sd["quant_conv.weight"].shape[-1]
    shared = count_indexed(sd, "quantize.quant_resi.qresi_ls")
    if shared:
        cfg["share_quant_resi"] = shared
    elif "quantize.quant_resi.qresi.weight" in sd:
        cfg["share_quant_resi"] = 1
    elif count_indexed(sd, "quantize.quant_resi"):
        cfg["share_quant_resi"], cfg["default_qresi_counts"] = 0, count_indexed(sd, "quantize.quant_resi")
    return cfg


def is_msvq(sd):
    return "quantize.embedding.weight" in sd and any(k.startswith("encoder.down.") for k in sd)


for _name in ("var-vqvae", "msvq"):  # the official name and vgen's short one
    register_kind(_name, MultiScaleVQVAE, MSVQConfig, infer_msvq, is_msvq, "VAR multi-scale VQVAE")
