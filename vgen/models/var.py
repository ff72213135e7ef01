"""VAR: visual autoregressive modelling by next-scale prediction (FoundationVision/VAR ``models/var.py``,
``basic_var.py``), with the official parameter names so the released ``var_d{16,20,24,30}.pth`` load strictly.

A class token starts the pyramid; every scale's token map is predicted at once from all coarser scales
(block-causal attention over scales, full attention within a scale). Blocks are AdaLN-conditioned on the class
embedding; attention uses l2-normalised q and k with a learned per-head temperature; positions are learned
absolute embeddings plus a level embedding.

The next-scale model interface (what ``vgen.samplers.var`` drives, family-agnostic):

* ``patch_nums``, ``vocab_size``, ``num_classes``, ``seq_len`` and ``token_shape`` (tokens of all scales)
* ``null_cond(cond)``, ``new_cache(batch_size, policy=None)``
* ``scale_logits(si, cond, x, cache) -> (B, pn*pn, V)``: scale ``si`` from the cache and this scale's input
  ``x`` (None for the first scale; else the tokenizer's (B, pn*pn, Cvae) next-scale input)
* ``start_fhat(batch_size)`` / ``next_scale_input(si, f_hat, idx)``: the bound tokenizer's accumulation
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.errors import VGenError
from vgen.interfaces import Order, TokenType
from vgen.kernels.staged_cache import CachePolicy, StagedKVCache
from vgen.models.loading import count_indexed, register_kind


@dataclass
class VARConfig:
    vocab_size: int = 4096  # V of the multi-scale VQVAE
    Cvae: int = 32
    depth: int = 16
    embed_dim: int = 0  # 0: 64 * depth (as build_vae_var)
    num_heads: int = 0  # 0: depth
    mlp_ratio: float = 4.0
    num_classes: int = 1000
    patch_nums: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 8, 10, 13, 16])
    norm_eps: float = 1e-6
    shared_aln: bool = False
    attn_l2_norm: bool = True
    cond_drop_rate: float = 0.1
    drop_path_rate: float = 0.0

    def __post_init__(self):
        self.embed_dim = self.embed_dim or 64 * self.depth
        self.num_heads = self.num_heads or self.depth
        self.patch_nums = [int(p) for p in self.patch_nums]
        if self.embed_dim % self.num_heads:
            raise VGenError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")

    @property
    def seq_len(self) -> int:
        return sum(p * p for p in self.patch_nums)


class SelfAttention(nn.Module):
    def __init__(self, cfg: VARConfig):
        super().__init__()
        C, H = cfg.embed_dim, cfg.num_heads
        self.num_heads, self.head_dim, self.l2 = H, C // H, cfg.attn_l2_norm
        if self.l2:
            self.scale = 1.0
            self.scale_mul_1H11 = nn.Parameter(torch.full((1, H, 1, 1), 4.0).log())
            self.max_scale_mul = math.log(100)
        else:
            self.scale = 0.25 / math.sqrt(self.head_dim)
        self.mat_qkv = nn.Linear(C, 3 * C, bias=False)
        self.q_bias, self.v_bias = nn.Parameter(torch.zeros(C)), nn.Parameter(torch.zeros(C))
        self.register_buffer("zero_k_bias", torch.zeros(C))
        self.proj = nn.Linear(C, C)

    def forward(self, x, attn_bias=None, cache: StagedKVCache | None = None, layer: int = 0):
        B, L, C = x.shape
        bias = torch.cat([self.q_bias, self.zero_k_bias, self.v_bias])
        qkv = F.linear(x, self.mat_qkv.weight, bias) if isinstance(self.mat_qkv, nn.Linear) else self.mat_qkv(x) + bias
        q, k, v = qkv.view(B, L, 3, self.num_heads, self.head_dim) \
            .permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, L, D)
        if self.l2:
            q = F.normalize(q, dim=-1) * self.scale_mul_1H11.clamp_max(self.max_scale_mul).exp()
            k = F.normalize(k, dim=-1)
        if cache is not None:
            out = cache.attend(layer, q, k, v, self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(B, L, C))


class FFN(nn.Module):
    def __init__(self, C: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(C, hidden), nn.Linear(hidden, C)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def _drop_path(x, p: float, training: bool):
    if p == 0.0 or not training:
        return x
    keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1 - p)
    return x * keep / (1 - p)


class AdaLNSelfAttn(nn.Module):
    def __init__(self, cfg: VARConfig, drop_path: float = 0.0):
        super().__init__()
        C = cfg.embed_dim
        self.C, self.shared_aln, self.drop_path = C, cfg.shared_aln, drop_path
        self.attn = SelfAttention(cfg)
        self.ffn = FFN(C, round(C * cfg.mlp_ratio))
        self.ln_wo_grad = nn.LayerNorm(C, eps=cfg.norm_eps, elementwise_affine=False)
        if cfg.shared_aln:
            self.ada_gss = nn.Parameter(torch.randn(1, 1, 6, C) / C ** 0.5)
        else:
            self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))

    def forward(self, x, cond_BD, attn_bias=None, cache=None, layer=0):
        if self.shared_aln:
            g1, g2, s1, s2, b1, b2 = (self.ada_gss + cond_BD).unbind(2)
        else:
            g1, g2, s1, s2, b1, b2 = self.ada_lin(cond_BD).view(-1, 1, 6, self.C).unbind(2)
        a = self.attn(self.ln_wo_grad(x) * (s1 + 1) + b1, attn_bias, cache, layer)
        x = x + _drop_path(a * g1, self.drop_path, self.training)
        f = self.ffn(self.ln_wo_grad(x) * (s2 + 1) + b2)
        return x + _drop_path(f * g2, self.drop_path, self.training)


class AdaLNBeforeHead(nn.Module):
    def __init__(self, C: int, eps: float):
        super().__init__()
        self.C = C
        self.ln_wo_grad = nn.LayerNorm(C, eps=eps, elementwise_affine=False)
        self.ada_lin = nn.Sequential(nn.SiLU(), nn.Linear(C, 2 * C))

    def forward(self, x, cond_BD):
        scale, shift = self.ada_lin(cond_BD).view(-1, 1, 2, self.C).unbind(2)
        return self.ln_wo_grad(x) * (scale + 1) + shift


class _SharedAdaLin(nn.Linear):
    def forward(self, cond_BD):
        return super().forward(cond_BD).view(-1, 1, 6, self.weight.shape[0] // 6)


class VAR(nn.Module):
    """A :class:`vgen.interfaces.NextScaleModel`."""
    order = Order.NEXT_SCALE

    def __init__(self, config: VARConfig | None = None, **kwargs):
        super().__init__()
        cfg = self.config = config or VARConfig(**kwargs)
        C, pn = cfg.embed_dim, cfg.patch_nums
        self.L, self.first_l = cfg.seq_len, pn[0] ** 2
        self.begin_ends, cur = [], 0
        for p in pn:
            self.begin_ends.append((cur, cur + p * p))
            cur += p * p
        std = math.sqrt(1 / C / 3)
        self.word_embed = nn.Linear(cfg.Cvae, C)
        self.class_emb = nn.Embedding(cfg.num_classes + 1, C)  # last row: the null class for CFG
        self.pos_start = nn.Parameter(torch.empty(1, self.first_l, C))
        self.pos_1LC = nn.Parameter(torch.empty(1, self.L, C))
        self.lvl_embed = nn.Embedding(len(pn), C)
        for t in (self.class_emb.weight, self.pos_start, self.pos_1LC, self.lvl_embed.weight):
            nn.init.trunc_normal_(t.data, std=std)
        self.shared_ada_lin = nn.Sequential(nn.SiLU(), _SharedAdaLin(C, 6 * C)) if cfg.shared_aln else nn.Identity()
        dpr = torch.linspace(0, cfg.drop_path_rate, cfg.depth).tolist()
        self.blocks = nn.ModuleList([AdaLNSelfAttn(cfg, dpr[i]) for i in range(cfg.depth)])
        d = torch.cat([torch.full((p * p,), i) for i, p in enumerate(pn)]).view(1, self.L, 1)
        self.register_buffer("lvl_1L", d.transpose(1, 2)[:, 0].contiguous())
        self.register_buffer("attn_bias_for_masking",
                             torch.where(d >= d.transpose(1, 2), 0.0, -torch.inf).reshape(1, 1, self.L, self.L))
        self.head_nm = AdaLNBeforeHead(C, cfg.norm_eps)
        self.head = nn.Linear(C, cfg.vocab_size)
        self._tokenizer: tuple = ()

    # ---- the model interface -------------------------------------------------------------------------------
    @property
    def patch_nums(self) -> list[int]:
        return list(self.config.patch_nums)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def seq_len(self) -> int:
        return self.L

    @property
    def token_shape(self) -> tuple[int]:
        """The flat pyramid of every scale's tokens, coarse to fine, as the multi-scale VQVAE reads it."""
        return (self.L,)

    @property
    def token_type(self) -> TokenType:
        return TokenType.codes(self.config.vocab_size)

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        return torch.full_like(cond, self.config.num_classes)

    def new_cache(self, batch_size: int = 0, policy: CachePolicy | None = None) -> StagedKVCache:
        return StagedKVCache(self.config.depth, policy)

    def attach_tokenizer(self, tokenizer) -> VAR:
        """Bind the multi-scale VQVAE whose codes this model predicts (needed to build each scale's input).
        Kept outside the module's parameters, as in the official code."""
        q = tokenizer.quantize
        if q.vocab_size != self.vocab_size or list(q.patch_nums) != self.patch_nums or q.Cvae != self.config.Cvae:
            raise VGenError(f"tokenizer (V={q.vocab_size}, Cvae={q.Cvae}, scales {q.patch_nums}) does not match "
                            f"this VAR (V={self.vocab_size}, Cvae={self.config.Cvae}, scales {self.patch_nums})")
        self._tokenizer = (tokenizer,)
        return self

    def _quantizer(self):
        if not self._tokenizer:
            raise VGenError("this VAR has no tokenizer bound: call model.attach_tokenizer(vqvae) (a Pipeline does "
                            "this for you); VAR builds each scale's input from the VQVAE's codebook")
        return self._tokenizer[0].quantize

    def start_fhat(self, batch_size: int) -> torch.Tensor:
        p = self.patch_nums[-1]
        return self.class_emb.weight.new_zeros(batch_size, self.config.Cvae, p, p)

    def next_scale_input(self, si: int, f_hat: torch.Tensor, idx: torch.Tensor):
        return self._quantizer().next_input(si, f_hat, idx)

    def _cond(self, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cond_BD = self.class_emb(cond)
        return cond_BD, self.shared_ada_lin(cond_BD)

    def _lvl_pos(self, si: int) -> torch.Tensor:
        b, e = self.begin_ends[si]
        return self.lvl_embed(self.lvl_1L[:, b:e]) + self.pos_1LC[:, b:e]

    def scale_logits(self, si: int, cond: torch.Tensor, x: torch.Tensor | None, cache: StagedKVCache) -> torch.Tensor:
        """Logits (B, pn*pn, V) of scale ``si`` given the cache of coarser scales; extends the cache."""
        cond_BD, ada = self._cond(cond)
        if si == 0:
            h = cond_BD[:, None].expand(-1, self.first_l, -1) + self.pos_start + self._lvl_pos(0)
        else:
            h = self.word_embed(x) + self._lvl_pos(si)
        p = self.patch_nums[si]
        cache.begin_stage(si, (p, p), last=si == len(self.patch_nums) - 1)
        for i, blk in enumerate(self.blocks):
            h = blk(h, ada, cache=cache, layer=i)
        cache.end_stage()
        return self.head(self.head_nm(h.float(), cond_BD)).float()

    def init_weights(self, init_adaln: float = 0.5, init_adaln_gamma: float = 1e-5, init_head: float = 0.02,
                     init_std: float = -1.0) -> VAR:
        """The official training initialisation (``build_vae_var`` defaults): truncated-normal weights, zero
        biases, a small head, residual projections scaled by 1/sqrt(2 depth), AdaLN gains near zero."""
        C, depth = self.config.embed_dim, self.config.depth
        std = (1 / C / 3) ** 0.5 if init_std < 0 else init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(m.weight.data, std=std)
                if getattr(m, "bias", None) is not None:
                    m.bias.data.zero_()
        self.head.weight.data.mul_(init_head)
        self.head.bias.data.zero_()
        self.head_nm.ada_lin[-1].weight.data.mul_(init_adaln)
        self.head_nm.ada_lin[-1].bias.data.zero_()
        for blk in self.blocks:
            blk.attn.proj.weight.data.div_(math.sqrt(2 * depth))
            blk.ffn.fc2.weight.data.div_(math.sqrt(2 * depth))
            if hasattr(blk, "ada_lin"):
                blk.ada_lin[-1].weight.data[2 * C:].mul_(init_adaln)
                blk.ada_lin[-1].weight.data[:2 * C].mul_(init_adaln_gamma)
                blk.ada_lin[-1].bias.data.zero_()
            else:
                blk.ada_gss.data[:, :, 2:].mul_(init_adaln)
                blk.ada_gss.data[:, :, :2].mul_(init_adaln_gamma)
        return self

    # ---- training ------------------------------------------------------------------------------------------
    def forward(self, cond: torch.Tensor, x_BLCv_wo_first_l: torch.Tensor) -> torch.Tensor:
        """Teacher-forced logits (B, L, V) (official ``VAR.forward``). ``cond``: class ids, with the null class
        (``num_classes``) where the condition is dropped; in training mode, ``cond_drop_rate`` of them are
        dropped here."""
        B = cond.shape[0]
        if self.training and self.config.cond_drop_rate > 0:
            drop = torch.rand(B, device=cond.device) < self.config.cond_drop_rate
            cond = torch.where(drop, self.config.num_classes, cond)
        cond_BD, ada = self._cond(cond)
        sos = cond_BD[:, None].expand(B, self.first_l, -1) + self.pos_start
        h = torch.cat([sos, self.word_embed(x_BLCv_wo_first_l.float())], dim=1)
        h = h + self.lvl_embed(self.lvl_1L.expand(B, -1)) + self.pos_1LC
        for blk in self.blocks:
            h = blk(h, ada, attn_bias=self.attn_bias_for_masking)
        return self.head(self.head_nm(h.float(), cond_BD)).float()

    def config_dict(self) -> dict:
        return dataclasses.asdict(self.config)


def infer_var(sd: dict) -> dict:
    cfg: dict = {}
    if "head.weight" in sd:
        cfg["vocab_size"], cfg["embed_dim"] = sd["head.weight"].shape
    if "word_embed.weight" in sd:
        cfg["Cvae"] = sd["word_embed.weight"].shape[1]
    cfg["depth"] = count_indexed(sd, "blocks")
    scale_mul = sd.get("blocks.0.attn.scale_mul_1H11")
    cfg["attn_l2_norm"] = scale_mul is not None
    if scale_mul is not None:
        cfg["num_heads"] = scale_mul.shape[1]
    elif cfg["depth"]:
        cfg["num_heads"] = cfg["depth"]  # official builds use heads = depth
    if "class_emb.weight" in sd:
        cfg["num_classes"] = sd["class_emb.weight"].shape[0] - 1
    if "lvl_1L" in sd:  # the level of every token: its counts give the scale schedule
        counts = torch.bincount(sd["lvl_1L"].flatten().long()).tolist()
        cfg["patch_nums"] = [round(c ** 0.5) for c in counts]
    cfg["shared_aln"] = "shared_ada_lin.1.weight" in sd
    fc1 = sd.get("blocks.0.ffn.fc1.weight")
    if fc1 is not None and "embed_dim" in cfg:
        cfg["mlp_ratio"] = fc1.shape[0] / cfg["embed_dim"]
    return cfg


def is_var(sd):
    return "lvl_1L" in sd or ("blocks.0.attn.mat_qkv.weight" in sd and "head_nm.ada_lin.1.weight" in sd)


def var_preset(cfg: dict) -> str | None:
    if cfg.get("depth") and cfg.get("embed_dim") == 64 * cfg["depth"]:
        return f"VAR-d{cfg['depth']}"
    return None


register_kind("var", VAR, VARConfig, infer_var, is_var, "VAR next-scale transformer", preset=var_preset)
