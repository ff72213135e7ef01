"""LlamaGen's GPT (class- or caption-conditional Llama over image tokens), gpt-fast style.

Parameter names and config fields match FoundationVision/LlamaGen so checkpoints move both ways
unchanged. Two forward paths:

* ``forward(tokens, cond)``: teacher forcing, ``logits[:, i]`` predicts ``tokens[:, i]``.
* ``prefill(cond, cache)`` / ``decode(tokens, input_pos, cache, attn_mask)``: the cached path the
  samplers drive, with any positions (shared or per sample) and any attention mask.

Positions: the condition occupies positions 0..cls_token_num-1, image token i sits at cls_token_num+i.
The 2D RoPE table has all-zero rows for the condition positions (so their q and k are zeroed, as in the
official code) and, for image tokens, rotates the first half of each head's channels by the row index
and the second half by the column index, in interleaved (even, odd) pairs.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from vgen.interfaces import Order, TokenType
from vgen.kernels.kv_cache import KVCache
from vgen.kernels.linear import Linear
from vgen.models.loading import GPT_PRESETS, count_indexed, register_kind

CLASS_CONDITIONAL = ("c2i", "class_cond")  # LlamaGen's name, LARP's (NAR video) name


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - (n % k)


@dataclass
class GPTConfig:
    # Field names are LlamaGen's ModelArgs.
    dim: int = 4096
    n_layer: int = 32
    n_head: int = 32
    n_kv_head: int | None = None
    multiple_of: int = 256
    ffn_dim_multiplier: float | None = None
    rope_base: float = 10000
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    token_dropout_p: float = 0.1
    attn_dropout_p: float = 0.0
    resid_dropout_p: float = 0.1
    ffn_dropout_p: float = 0.1
    drop_path_rate: float = 0.0
    num_classes: int = 1000
    caption_dim: int = 2048
    class_dropout_prob: float = 0.1
    model_type: str = "c2i"
    vocab_size: int = 16384
    cls_token_num: int = 1
    block_size: int = 256
    max_batch_size: int = 32
    max_seq_len: int = 2048

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def ffn_hidden(self) -> int:
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


def rope_table_2d(grid_size: int, head_dim: int, base: float, cls_token_num: int) -> torch.Tensor:
    """(cls_token_num + grid_size**2, head_dim // 2, 2) cos/sin table; zero rows for the condition."""
    half = head_dim // 2
    freqs = 1.0 / (base ** (torch.arange(0, half, 2)[: half // 2].float() / half))
    ang = torch.outer(torch.arange(grid_size, dtype=torch.float32), freqs)  # (g, half/2)
    grid = torch.cat([ang[:, None, :].expand(-1, grid_size, -1),   # row angle, first half
                      ang[None, :, :].expand(grid_size, -1, -1)],  # column angle, second half
                     dim=-1).flatten(0, 1)  # (g*g, half)
    table = torch.stack([grid.cos(), grid.sin()], dim=-1)
    return torch.cat([torch.zeros(cls_token_num, half, 2), table])


def apply_rope(x: torch.Tensor, rope: torch.Tensor | None) -> torch.Tensor:
    """x (B, S, H, D); rope (S, D/2, 2) or (B, S, D/2, 2); None: no rotation (absolute positions)."""
    if rope is None:
        return x
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    if rope.dim() == 3:
        rope = rope[None]
    c, s = rope[:, :, None, :, 0], rope[:, :, None, :, 1]
    x0, x1 = xs[..., 0], xs[..., 1]
    return torch.stack([x0 * c - x1 * s, x1 * c + x0 * s], dim=-1).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.n_kv_head = cfg.n_kv_head or cfg.n_head
        self.head_dim = cfg.head_dim
        self.dim = cfg.dim
        self.wqkv = Linear(cfg.dim, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=False)
        self.wo = Linear(cfg.dim, cfg.dim, bias=False)
        self.attn_dropout_p = cfg.attn_dropout_p
        self.resid_dropout = nn.Dropout(cfg.resid_dropout_p)

    def project(self, x, rope):
        """Queries (B, H, S, D), keys and values (B, Hkv, S, D) of x (B, S, dim), q and k rotated."""
        b, s, _ = x.shape
        kv = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.dim, kv, kv], dim=-1)
        q = apply_rope(q.view(b, s, self.n_head, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(k.view(b, s, self.n_kv_head, self.head_dim), rope).transpose(1, 2)
        return q, k, v.view(b, s, self.n_kv_head, self.head_dim).transpose(1, 2)

    def forward(self, x, rope, mask=None, cache: KVCache | None = None, layer: int = 0, input_pos=None):
        b, s, _ = x.shape
        q, k, v = self.project(x, rope)
        if cache is not None:
            k, v = cache.update(layer, input_pos, k, v)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None,
            dropout_p=self.attn_dropout_p if self.training else 0.0,
            enable_gqa=self.n_kv_head != self.n_head)
        return self.resid_dropout(self.wo(y.transpose(1, 2).reshape(b, s, self.dim)))


class FeedForward(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        h = cfg.ffn_hidden
        self.w1 = Linear(cfg.dim, h, bias=False)
        self.w3 = Linear(cfg.dim, h, bias=False)
        self.w2 = Linear(h, cfg.dim, bias=False)
        self.ffn_dropout = nn.Dropout(cfg.ffn_dropout_p)

    def forward(self, x):
        return self.ffn_dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.attention = Attention(cfg)
        self.feed_forward = FeedForward(cfg)
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)

    def forward(self, x, rope, mask=None, cache=None, layer=0, input_pos=None):
        h = x + self.attention(self.attention_norm(x), rope, mask, cache, layer, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, dim: int, dropout_prob: float):
        super().__init__()
        self.embedding_table = nn.Embedding(num_classes + int(dropout_prob > 0), dim)
        self.num_classes = num_classes
        self.dropout_prob = dropout_prob

    def forward(self, labels, train: bool = False):
        if train and self.dropout_prob > 0:
            drop = torch.rand(labels.shape[0], device=labels.device) < self.dropout_prob
            labels = torch.where(drop, self.num_classes, labels)
        return self.embedding_table(labels).unsqueeze(1)


class _MLP(nn.Module):
    def __init__(self, cin, hidden, cout):
        super().__init__()
        self.fc1 = Linear(cin, hidden, bias=False)
        self.fc2 = Linear(hidden, cout, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    """t2i condition: caption features (B, cls_token_num, caption_dim) -> (B, cls_token_num, dim)."""

    def __init__(self, caption_dim: int, dim: int, dropout_prob: float, token_num: int):
        super().__init__()
        self.cap_proj = _MLP(caption_dim, dim, dim)
        self.register_buffer("uncond_embedding", torch.randn(token_num, caption_dim) / caption_dim ** 0.5)
        self.dropout_prob = dropout_prob

    def forward(self, caption, train: bool = False):
        if train and self.dropout_prob > 0:
            drop = torch.rand(caption.shape[0], device=caption.device) < self.dropout_prob
            caption = torch.where(drop[:, None, None], self.uncond_embedding, caption)
        return self.cap_proj(caption)


class GPT(nn.Module):
    """A :class:`vgen.interfaces.NextTokenModel`."""
    order = Order.NEXT_TOKEN

    def __init__(self, config: GPTConfig | None = None, **kwargs):
        super().__init__()
        self.config = cfg = config or GPTConfig(**kwargs)
        if cfg.model_type in CLASS_CONDITIONAL:
            self.cls_embedding = LabelEmbedder(cfg.num_classes, cfg.dim, cfg.class_dropout_prob)
        elif cfg.model_type == "t2i":
            self.cls_embedding = CaptionEmbedder(cfg.caption_dim, cfg.dim, cfg.class_dropout_prob, cfg.cls_token_num)
        else:
            raise ValueError(f"model_type must be 'c2i' or 't2i', got {cfg.model_type!r}")
        self.tok_embeddings = self.build_embedding()
        self.tok_dropout = nn.Dropout(cfg.token_dropout_p)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layer))
        self.build_heads()
        self.register_buffer("freqs_cis", self.rope_table(), persistent=False)
        self.apply(self._init_weights)
        self.init_heads()

    def build_embedding(self) -> nn.Module:
        """Token ids -> vectors (a model over continuous tokens projects them instead)."""
        return nn.Embedding(self.config.vocab_size, self.config.dim)

    def build_heads(self) -> None:
        """The output head(s): LlamaGen's next-token head reads after the last block."""
        self.norm = RMSNorm(self.config.dim, self.config.norm_eps)
        self.output = Linear(self.config.dim, self.config.vocab_size, bias=False)

    def init_heads(self) -> None:
        nn.init.zeros_(self.output.weight)  # the official init

    def rope_table(self) -> torch.Tensor:
        """The RoPE table over [condition, tokens]: LlamaGen's 2D table over a square grid."""
        cfg = self.config
        g = int(round(cfg.block_size ** 0.5))
        if g * g != cfg.block_size:
            raise ValueError(f"block_size must be a square number of tokens, got {cfg.block_size}")
        return rope_table_2d(g, cfg.head_dim, cfg.rope_base, cfg.cls_token_num)

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, self.config.initializer_range)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)

    # ---- the small interface samplers use -------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def seq_len(self) -> int:
        return self.config.block_size

    @property
    def cond_len(self) -> int:
        return self.config.cls_token_num

    @property
    def token_shape(self) -> tuple[int, int]:
        """The (h, w) token grid (square: LlamaGen's 2D RoPE)."""
        g = int(round(self.config.block_size ** 0.5))
        return (g, g)

    @property
    def token_type(self) -> TokenType:
        return TokenType.codes(self.config.vocab_size)

    @property
    def class_conditional(self) -> bool:
        """Whether the condition is class ids (the config's model_type c2i) rather than caption features (t2i)."""
        return self.config.model_type in CLASS_CONDITIONAL

    @property
    def conditioning(self) -> str:
        """``class`` (class ids (B,)) or ``text`` (caption features (B, cls_token_num, caption_dim), left-padded with
        zero rows: :meth:`cond_mask`)."""
        return "class" if self.class_conditional else "text"

    def cond_mask(self, cond: torch.Tensor) -> torch.Tensor | None:
        """Which condition positions are real (B, cls_token_num) bool, None for class ids. Captions come as
        LlamaGen's ``sample_t2i.py`` hands them to ``generate``: valid features moved to the end (left padding), the
        padding rows zeroed, so the mask is the non-zero rows (``emb_masks`` in the official code)."""
        if self.class_conditional:
            return None
        return cond.ne(0).any(-1)

    def null_cond(self, cond: torch.Tensor) -> torch.Tensor:
        """The unconditional counterpart of ``cond`` for classifier-free guidance: the null class, or the learned
        null caption under ``cond``'s caption mask (the official ``generate`` masks both halves alike)."""
        if self.class_conditional:
            return torch.full_like(cond, self.config.num_classes)
        null = self.cls_embedding.uncond_embedding.to(cond.dtype)
        return null * self.cond_mask(cond)[..., None].to(cond.dtype)

    def new_cache(self, batch_size: int, max_len: int | None = None, dtype=None, device=None) -> KVCache:
        cfg = self.config
        w = self.tok_embeddings.weight
        return KVCache(cfg.n_layer, batch_size, cfg.n_kv_head or cfg.n_head,
                       max_len or cfg.cls_token_num + cfg.block_size, cfg.head_dim,
                       dtype or w.dtype, device or w.device)

    def embed_cond(self, cond: torch.Tensor) -> torch.Tensor:
        return self.cls_embedding(cond, train=self.training)[:, : self.config.cls_token_num]

    def positions(self, h: torch.Tensor, input_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Where position enters: (embeddings, RoPE rows). LlamaGen rotates q and k and adds nothing; a model
        with learned absolute positions adds them here and returns no RoPE."""
        return h, self.freqs_cis[input_pos]

    def run_layers(self, h, input_pos, cache=None, attn_mask=None):
        h, rope = self.positions(h, input_pos)
        if cache is not None:
            attn_mask = cache.visible(cache.causal_mask(input_pos) if attn_mask is None else attn_mask)
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, attn_mask, cache, i, input_pos)
        return h

    def head(self, h):
        return self.output(self.norm(h)).float()

    def condition_hidden(self, cond: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the condition through the model and fill the cache: the last hidden state (B, d) (before the final
        norm). A padded caption's padding keys are hidden from every later query (``cache.mask_keys``); in this
        pass each padding position reads only itself (the official mask's kept diagonal)."""
        h = self.embed_cond(cond)
        pos = torch.arange(h.shape[1], device=h.device)
        valid = self.cond_mask(cond)
        cache.mask_keys(valid)
        mask = None
        if valid is not None:
            mask = cache.causal_mask(pos) | (cache.slots[: cache.length] == pos[:, None])[None, None]
        return self.run_layers(h, pos, cache, mask)[:, -1]

    def prefill(self, cond: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the condition through the model, fill the cache; logits (B, V) for image token 0."""
        return self.head(self.condition_hidden(cond, cache))

    def decode(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: KVCache,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed image tokens (B, S) at sequence positions ``input_pos`` ((S,) or (B, S); image token i is at
        cls_token_num + i). ``logits[:, j]`` is the next-token distribution after ``tokens[:, j]``."""
        return self.head(self.run_layers(self.tok_embeddings(tokens), input_pos, cache, attn_mask))

    def prefill_features(self, cond: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """``prefill`` plus the last hidden state (before the final norm) after the condition: what a draft head
        reads (:mod:`vgen.models.drafter`)."""
        h = self.condition_hidden(cond, cache)
        return self.head(h), h

    def decode_features(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: KVCache,
                        attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``decode`` plus the hidden states (B, S, d) before the final norm."""
        h = self.run_layers(self.tok_embeddings(tokens), input_pos, cache, attn_mask)
        return self.head(h), h

    def teacher_features(self, tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Teacher-forced hidden states (before the final norm) over tokens (B, L): (B, L, d), row i predicts token
        i (row 0: the state after the condition). What a draft head trains on (:mod:`vgen.models.drafter`)."""
        return self.teacher_hidden(tokens, cond)[:, self.cond_len - 1:]

    def teacher_hidden(self, tokens: torch.Tensor, cond: torch.Tensor, attn_mask: torch.Tensor | None = None):
        """Teacher forcing's hidden states (before the final norm) over [condition, tokens[:, :-1]]: (B, S, d) with
        row ``cond_len - 1 + i`` predicting ``tokens[:, i]``. A padded caption's padding keys are hidden (the
        official mask: causal, padding columns zeroed, the diagonal kept)."""
        c = self.embed_cond(cond)
        h = torch.cat([c, self.tok_embeddings(tokens[:, :-1])], dim=1)
        h = self.tok_dropout(h)
        pos = torch.arange(h.shape[1], device=h.device)
        valid = self.cond_mask(cond)
        if valid is not None and attn_mask is None:
            n = h.shape[1]
            keys = torch.cat([valid, valid.new_ones(valid.shape[0], n - valid.shape[1])], 1)
            causal = torch.ones(n, n, dtype=torch.bool, device=h.device).tril()
            attn_mask = (causal & keys[:, None, :] | torch.eye(n, dtype=torch.bool, device=h.device))[:, None]
        return self.run_layers(h, pos, None, attn_mask)

    def forward(self, tokens: torch.Tensor, cond: torch.Tensor, attn_mask: torch.Tensor | None = None):
        """Teacher forcing: tokens (B, L) -> logits (B, L, V), ``logits[:, i]`` predicts ``tokens[:, i]``."""
        return self.head(self.teacher_hidden(tokens, cond, attn_mask)[:, self.config.cls_token_num - 1:])

    def config_dict(self) -> dict:
        return asdict(self.config)


_HEAD_DIM_GUESS = {d: n_head for (_, n_head, d) in GPT_PRESETS.values()}


def infer_gpt(sd: dict) -> dict:
    cfg: dict = {}
    if "tok_embeddings.weight" in sd:
        cfg["vocab_size"], cfg["dim"] = sd["tok_embeddings.weight"].shape
    cfg["n_layer"] = count_indexed(sd, "layers")
    dim = cfg.get("dim")
    if dim is not None:
        n_head = _HEAD_DIM_GUESS.get(dim)  # n_head is invisible in the shapes: known for the presets only
        if n_head is not None:
            cfg["n_head"] = n_head
        wqkv = sd.get("layers.0.attention.wqkv.weight")
        if wqkv is not None and n_head is not None:
            head_dim = dim // n_head
            n_kv = (wqkv.shape[0] // head_dim - n_head) // 2
            if n_kv != n_head:
                cfg["n_kv_head"] = n_kv
        w1 = sd.get("layers.0.feed_forward.w1.weight")
        if w1 is not None and w1.shape[0] != find_multiple(int(8 * dim / 3), 256):
            cfg["ffn_dim_multiplier"] = w1.shape[0] / int(8 * dim / 3)
            cfg["multiple_of"] = 1
    if "cls_embedding.embedding_table.weight" in sd:
        cfg["model_type"] = "c2i"
        rows = sd["cls_embedding.embedding_table.weight"].shape[0]
        cfg["num_classes"] = rows - 1  # released models keep a null-class row for CFG
        cfg["cls_token_num"] = 1
    elif "cls_embedding.cap_proj.fc1.weight" in sd:
        cfg["model_type"] = "t2i"
        cfg["caption_dim"] = sd["cls_embedding.cap_proj.fc1.weight"].shape[1]
        if "cls_embedding.uncond_embedding" in sd:
            cfg["cls_token_num"] = sd["cls_embedding.uncond_embedding"].shape[0]
    if "freqs_cis" in sd:  # some released files still carry the RoPE table: it fixes the grid size
        cfg["block_size"] = sd["freqs_cis"].shape[0] - cfg.get("cls_token_num", 1)
    return cfg


def is_gpt(sd):
    return "tok_embeddings.weight" in sd and not ({"medusa_output.weight", "output_B.weight"} & set(sd))


def gpt_preset(cfg: dict) -> str | None:
    return next((name for name, (n_layer, _, dim) in GPT_PRESETS.items()
                 if cfg.get("dim") == dim and cfg.get("n_layer") == n_layer), None)


register_kind("gpt", GPT, GPTConfig, infer_gpt, is_gpt, "LlamaGen GPT", preset=gpt_preset, required=("n_head",))
