"""MAR: masked autoregressive image generation with a per-token diffusion head (LTH14/mar ``models/mar.py``, as
vendored by MarkXCloud/CSpD), with the official parameter names so the released ``mar_{base,large,huge}``
checkpoints load strictly.

Tokens are float latents (a KL tokenizer's, ``patch_size`` x ``patch_size`` of them per token). A bidirectional
MAE-style encoder reads the known tokens after ``buffer_size`` copies of the class embedding (``fake_latent`` for
the null class: label drop in training, the unconditional rows of CFG); the decoder puts them back among learned
mask tokens and returns one condition ``z`` per position for the diffusion head (``diffloss``,
:class:`vgen.models.diffusion_head.DiffusionHead`), which draws the unknown tokens. Both halves are timm ViT
``Block`` stacks, exactly as the official model builds them.

The :class:`vgen.interfaces.MaskedModel` interface (what ``vgen.samplers.mar`` drives):

* ``conditions(tokens (B, L, C), mask (B, L), cond (B,)) -> z (B, L, D)``: ``mask`` 1 = unknown; every row must
  have the same number of unknowns (the encoder drops them); class id ``num_classes`` is the null class
* ``sample_head(z, noise, step_noise, ...)``: the diffusion head's reverse process
* ``forward(x, labels)``: the official training loss (random orders, a truncated-normal mask ratio, label drop,
  ``diffusion_batch_mul`` timesteps per token)
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vgen.errors import VGenError
from vgen.interfaces import Order, TokenType
from vgen.models.diffusion_head import DiffusionHead, HeadSampling
from vgen.models.loading import count_indexed, register_kind

CLASS_TABLE_ROWS = 1000  # the official class table has 1000 rows whatever class_num is

# released sizes: encoder_embed_dim -> (name, depth, num_heads, diffloss_d, diffloss_w); decoder = encoder
MAR_PRESETS = {768: ("mar_base", 12, 12, 6, 1024), 1024: ("mar_large", 16, 16, 8, 1280),
               1280: ("mar_huge", 20, 16, 12, 1536)}


@dataclass
class MARConfig:
    """The official ``MAR(...)`` constructor arguments and defaults. Its ``norm_layer`` is ``norm_eps`` here: the
    class defaults to ``nn.LayerNorm`` (eps 1e-5), the ``mar_base/large/huge`` builders (the released weights)
    pass eps 1e-6, which loading assumes for those sizes."""
    img_size: int = 256
    vae_stride: int = 16
    patch_size: int = 1
    encoder_embed_dim: int = 1024
    encoder_depth: int = 16
    encoder_num_heads: int = 16
    decoder_embed_dim: int = 1024
    decoder_depth: int = 16
    decoder_num_heads: int = 16
    mlp_ratio: float = 4.0
    vae_embed_dim: int = 16
    mask_ratio_min: float = 0.7
    label_drop_prob: float = 0.1
    class_num: int = 1000
    attn_dropout: float = 0.1
    proj_dropout: float = 0.1
    buffer_size: int = 64
    diffloss_d: int = 3
    diffloss_w: int = 1024
    num_sampling_steps: int = 100    # the official code takes a string ("100"); either is accepted
    diffusion_batch_mul: int = 4
    grad_checkpointing: bool = False
    norm_eps: float = 1e-5

    def __post_init__(self):
        self.num_sampling_steps = int(self.num_sampling_steps)
        if self.img_size % (self.vae_stride * self.patch_size):
            raise VGenError(f"img_size {self.img_size} is not a multiple of vae_stride * patch_size = "
                            f"{self.vae_stride * self.patch_size}")
        for dim, heads, name in [(self.encoder_embed_dim, self.encoder_num_heads, "encoder"),
                                 (self.decoder_embed_dim, self.decoder_num_heads, "decoder")]:
            if dim % heads:
                raise VGenError(f"{name}_embed_dim {dim} is not divisible by {name}_num_heads {heads}")


class MAR(HeadSampling, nn.Module):
    """A :class:`vgen.interfaces.MaskedModel`."""
    order = Order.MASKED
    quantize_skip = ("diffloss",)  # quantize=: the diffusion head stays in float (it reads its weights' dtype)

    def __init__(self, config: MARConfig | None = None, **kwargs):
        super().__init__()
        self.config = cfg = config or MARConfig(**kwargs)
        self.seq_h = self.seq_w = cfg.img_size // cfg.vae_stride // cfg.patch_size
        self.seq_len = self.seq_h * self.seq_w
        self.token_embed_dim = cfg.vae_embed_dim * cfg.patch_size ** 2
        self.buffer_size = cfg.buffer_size
        enc, dec = cfg.encoder_embed_dim, cfg.decoder_embed_dim

        from timm.models.vision_transformer import Block  # here, not at import: timm pulls in torchvision and
        # dynamo, 2.5 s of every `vgen` command's start (docs/architecture.md, "Layers")

        def blocks(dim, depth, heads):
            return nn.ModuleList(
                Block(dim, heads, cfg.mlp_ratio, qkv_bias=True, norm_layer=self._norm, proj_drop=cfg.proj_dropout,
                      attn_drop=cfg.attn_dropout) for _ in range(depth))

        self.class_emb = nn.Embedding(max(CLASS_TABLE_ROWS, cfg.class_num), enc)
        self.fake_latent = nn.Parameter(torch.zeros(1, enc))
        # encoder: [buffer_size class tokens, known tokens]
        self.z_proj = nn.Linear(self.token_embed_dim, enc)
        self.z_proj_ln = nn.LayerNorm(enc, eps=1e-6)
        self.encoder_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len + self.buffer_size, enc))
        self.encoder_blocks = blocks(enc, cfg.encoder_depth, cfg.encoder_num_heads)
        self.encoder_norm = self._norm(enc)
        # decoder: every position, mask tokens where unknown
        self.decoder_embed = nn.Linear(enc, dec)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dec))
        self.decoder_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len + self.buffer_size, dec))
        self.decoder_blocks = blocks(dec, cfg.decoder_depth, cfg.decoder_num_heads)
        self.decoder_norm = self._norm(dec)
        self.diffusion_pos_embed_learned = nn.Parameter(torch.zeros(1, self.seq_len, dec))
        self.initialize_weights()
        self.diffloss = DiffusionHead(self.token_embed_dim, dec, cfg.diffloss_d, cfg.diffloss_w,
                                      cfg.num_sampling_steps)

    def _norm(self, dim: int, **kw) -> nn.LayerNorm:
        return nn.LayerNorm(dim, eps=self.config.norm_eps, **kw)

    def initialize_weights(self):
        for p in (self.class_emb.weight, self.fake_latent, self.mask_token, self.encoder_pos_embed_learned,
                  self.decoder_pos_embed_learned, self.diffusion_pos_embed_learned):
            nn.init.normal_(p, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):  # xavier, as JAX ViT
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm) and m.weight is not None:
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    # ---- the model interface ----
    @property
    def num_classes(self) -> int:
        return self.config.class_num

    @property
    def token_shape(self) -> tuple[int, int]:
        return (self.seq_h, self.seq_w)

    @property
    def token_channels(self) -> int:
        return self.token_embed_dim

    @property
    def token_type(self) -> TokenType:
        return TokenType.latents(self.token_embed_dim)

    @property
    def num_sampling_steps(self) -> int:
        return self.config.num_sampling_steps

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        return torch.full_like(cond, self.num_classes)

    def class_embedding(self, cond: torch.Tensor) -> torch.Tensor:
        """Class ids (B,) -> (B, D); the null class (``num_classes``, or any id outside the classes) is
        ``fake_latent``."""
        null = (cond < 0) | (cond >= self.num_classes)
        emb = self.class_emb(cond.clamp(0, self.num_classes - 1))
        return torch.where(null[:, None], self.fake_latent.to(emb.dtype), emb)

    def conditions(self, tokens: torch.Tensor, mask: torch.Tensor, cond: torch.Tensor,
                   unknown: int | None = None) -> torch.Tensor:
        return self.enc_dec(tokens.to(self.class_emb.weight.dtype), mask, self.class_embedding(cond), unknown)

    # ---- encoder / decoder ----
    def _run(self, blocks: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        for blk in blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.config.grad_checkpointing and self.training \
                else blk(x)
        return x

    def kept_positions(self, mask: torch.Tensor, unknown: int | None = None) -> torch.Tensor:
        """(B, L) mask (1 = unknown) -> (B, K) long: the positions of [buffer, tokens] the encoder reads, ascending,
        K = buffer + L - unknown per row. ``unknown`` None: read from the mask (and checked equal in every row, a
        host read); given: no read of the mask on the host."""
        mask = mask.bool()
        if unknown is None:
            counts = mask.sum(-1)
            if mask.shape[0] and bool((counts != counts[0]).any()):
                raise VGenError("every row of a MAR batch must have the same number of unknown tokens (the encoder "
                                "drops them): got " + ", ".join(map(str, counts.tolist())))
            unknown = int(counts[0]) if mask.shape[0] else 0
        dropped = torch.cat([mask.new_zeros(mask.shape[0], self.buffer_size), mask], dim=1)
        order = dropped.to(torch.uint8).argsort(dim=1, stable=True)  # the kept positions first, in order
        return order[:, : self.buffer_size + mask.shape[1] - unknown]

    def forward_mae_encoder(self, tokens: torch.Tensor, kept: torch.Tensor, class_embedding: torch.Tensor):
        x = self.z_proj(tokens)
        B, _, D = x.shape
        buf = class_embedding[:, None].to(x.dtype).expand(B, self.buffer_size, D)
        x = self.z_proj_ln(torch.cat([buf, x], dim=1) + self.encoder_pos_embed_learned)
        x = x.gather(1, kept[..., None].expand(-1, -1, D))  # drop the unknown tokens
        return self.encoder_norm(self._run(self.encoder_blocks, x))

    def forward_mae_decoder(self, x: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        x = self.decoder_embed(x)
        B, D = x.shape[0], x.shape[-1]
        full = self.mask_token.to(x.dtype).expand(B, self.buffer_size + self.seq_len, D)
        full = full.scatter(1, kept[..., None].expand(-1, -1, D), x)  # the kept positions back, mask tokens between
        x = self.decoder_norm(self._run(self.decoder_blocks, full + self.decoder_pos_embed_learned))
        return x[:, self.buffer_size:] + self.diffusion_pos_embed_learned

    def enc_dec(self, tokens: torch.Tensor, mask: torch.Tensor, class_embedding: torch.Tensor,
                unknown: int | None = None) -> torch.Tensor:
        """Tokens (B, L, C), mask (B, L) (1 = unknown), class embeddings (B, D) -> head conditions (B, L, D).
        ``unknown``: the number of unknown tokens per row when the caller knows it (:meth:`kept_positions`)."""
        kept = self.kept_positions(mask, unknown)
        return self.forward_mae_decoder(self.forward_mae_encoder(tokens, kept, class_embedding), kept)

    # ---- tokens <-> latent maps ----
    def patchify(self, x: torch.Tensor) -> torch.Tensor:
        """Latents (B, C, H, W) -> tokens (B, L, C * p * p), channel-major within a token (official order)."""
        B, C, H, W = x.shape
        p = self.config.patch_size
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(B, (H // p) * (W // p), C * p * p)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (B, L, C * p * p) -> latents (B, C, H, W)."""
        B, p, C = x.shape[0], self.config.patch_size, self.config.vae_embed_dim
        x = x.reshape(B, self.seq_h, self.seq_w, C, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(B, C, self.seq_h * p, self.seq_w * p)

    # ---- training ----
    def mask_ratio(self) -> float:
        """MAR's mask ratio: a normal at 1.0 (std 0.25) truncated to [mask_ratio_min, 1]."""
        a = (self.config.mask_ratio_min - 1.0) / 0.25
        lo = 0.5 * math.erfc(-a / math.sqrt(2))  # Phi(a); Phi(0) = 0.5
        u = float(torch.rand(()))
        return 1.0 + 0.25 * float(torch.special.ndtri(torch.tensor(lo + u * (0.5 - lo), dtype=torch.float64)))

    def random_mask(self, batch: int, device) -> torch.Tensor:
        """(B, L) float mask hiding the first ceil(L * ratio) positions of a random order per row."""
        orders = torch.rand(batch, self.seq_len, device=device).argsort(-1)
        n = int(math.ceil(self.seq_len * self.mask_ratio()))
        return torch.zeros(batch, self.seq_len, device=device).scatter_(-1, orders[:, :n], 1.0)

    def forward_loss(self, z: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = self.config.diffusion_batch_mul
        return self.diffloss.loss(target.reshape(-1, target.shape[-1]).repeat(m, 1),
                                  z.reshape(-1, z.shape[-1]).repeat(m, 1), mask.reshape(-1).repeat(m))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Training loss on latents (B, C, H, W) (or tokens (B, L, C * p * p)) with class ids (B,)."""
        tokens = self.patchify(x) if x.dim() == 4 else x
        mask = self.random_mask(tokens.shape[0], tokens.device)
        emb = self.class_embedding(labels)
        if self.training:  # label drop: the unconditional model CFG needs
            drop = torch.rand(labels.shape[0], device=labels.device) < self.config.label_drop_prob
            emb = torch.where(drop[:, None], self.fake_latent.to(emb.dtype), emb)
        z = self.enc_dec(tokens, mask, emb)
        return self.forward_loss(z, tokens.detach(), mask)

    def config_dict(self) -> dict:
        return dataclasses.asdict(self.config)

    def loss(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The training loss (the zoo recipes call every continuous model's ``loss(tokens, labels)``)."""
        return self(tokens, labels)


# ---- loading -----------------------------------------------------------------------------------------------------
def infer_mar(sd: dict) -> dict:
    """Config from tensor shapes. Assumes the official ``vae_stride=16, patch_size=1`` unless given (only
    ``vae_embed_dim * patch_size**2`` and ``img_size / (vae_stride * patch_size)`` show in the shapes; ``finalize``
    redoes the split for other values); head counts and the norm eps are known for the released sizes only."""
    cfg: dict = {}
    if "z_proj.weight" in sd:
        cfg["encoder_embed_dim"], cfg["vae_embed_dim"] = sd["z_proj.weight"].shape
    if "decoder_embed.weight" in sd:
        cfg["decoder_embed_dim"] = sd["decoder_embed.weight"].shape[0]
    cfg["encoder_depth"] = count_indexed(sd, "encoder_blocks")
    cfg["decoder_depth"] = count_indexed(sd, "decoder_blocks")
    fc1 = sd.get("encoder_blocks.0.mlp.fc1.weight")
    if fc1 is not None:
        cfg["mlp_ratio"] = fc1.shape[0] / fc1.shape[1]
    if "diffusion_pos_embed_learned" in sd and "encoder_pos_embed_learned" in sd:
        seq_len = sd["diffusion_pos_embed_learned"].shape[1]
        cfg["buffer_size"] = sd["encoder_pos_embed_learned"].shape[1] - seq_len
        side = math.isqrt(seq_len)
        if side * side == seq_len:
            cfg["img_size"] = side * MARConfig.vae_stride * MARConfig.patch_size
    if "diffloss.net.input_proj.weight" in sd:
        cfg["diffloss_w"] = sd["diffloss.net.input_proj.weight"].shape[0]
        cfg["diffloss_d"] = count_indexed(sd, "diffloss.net.res_blocks")
    for side in ("encoder", "decoder"):
        preset = MAR_PRESETS.get(cfg.get(f"{side}_embed_dim"))
        if preset is not None:
            cfg[f"{side}_num_heads"] = preset[2]
    if mar_preset(cfg):
        cfg["norm_eps"] = 1e-6  # mar_base/large/huge: norm_layer=partial(nn.LayerNorm, eps=1e-6)
    return cfg


def finalize_mar(cfg: dict, inferred: dict, given: dict) -> dict:
    """Redo the shape split for a given ``patch_size`` / ``vae_stride``: the token width is
    ``vae_embed_dim * patch_size**2`` and the grid side ``img_size / (vae_stride * patch_size)``."""
    p, s = cfg.get("patch_size", MARConfig.patch_size), cfg.get("vae_stride", MARConfig.vae_stride)
    if "vae_embed_dim" in inferred and "vae_embed_dim" not in given and inferred["vae_embed_dim"] % (p * p) == 0:
        cfg["vae_embed_dim"] = inferred["vae_embed_dim"] // (p * p)
    if "img_size" in inferred and "img_size" not in given:
        side = inferred["img_size"] // (MARConfig.vae_stride * MARConfig.patch_size)
        cfg["img_size"] = side * s * p
    return cfg


def is_mar(sd: dict) -> bool:
    return "diffloss.net.input_proj.weight" in sd and "encoder_blocks.0.attn.qkv.weight" in sd


def mar_preset(cfg: dict) -> str | None:
    p = MAR_PRESETS.get(cfg.get("encoder_embed_dim"))
    if p and cfg.get("encoder_depth") == p[1] and cfg.get("diffloss_d") == p[3] and cfg.get("diffloss_w") == p[4]:
        return p[0]
    return None


register_kind("mar", MAR, MARConfig, infer_mar, is_mar, "MAR (masked autoregressive model, diffusion head)",
              preset=mar_preset, finalize=finalize_mar, required=("encoder_num_heads", "decoder_num_heads"))
