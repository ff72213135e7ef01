"""NAR: LlamaGen's GPT with dimension-oriented heads for next-neighbour decoding (ThisisBillhe/NAR).

Parameter names and config fields match the official NAR code, so released NAR checkpoints load
unchanged. The model is the GPT with ``n_layer + medusa_attention_num`` blocks and two heads:

* the right head (``norm`` / ``output``) reads the hidden state after block ``n_layer - 1`` and predicts
  the token to the right of each token;
* the down head (``medusa_norm`` / ``medusa_output``) reads it after the last block (the
  ``medusa_attention_num`` extra blocks) and predicts the token below.

At the condition position both heads predict token (0, 0). A token that both heads reach (one from its left
neighbour, one from the token above) gets the mean of their logits; first-row tokens only have the right
head, first-column tokens only the down head. Attention follows the proximity mask
(:mod:`vgen.kernels.proximity`): a token sees the condition and every token on its own or an earlier
anti-diagonal.

Interface for next-neighbour samplers (on top of the GPT's ``seq_len``, ``new_cache`` ...): ``token_shape``
(the token grid, (h, w) here), ``neighbour_offsets`` (what each head predicts, as a step along one grid axis),
``prefill(cond, cache)`` -> logits for the first token, and ``decode_neighbours(tokens, input_pos, cache)``
-> one logits tensor per head.

The head wiring is a table (``heads``: offset, norm, output, and the block each head reads after), so a
variant with more heads -- a video model's next-frame head after further blocks, token grid (t, h, w) --
reuses ``run_heads``, ``combine``, the proximity kernels and the ``nar`` sampler unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from vgen.interfaces import Order
from vgen.kernels.kv_cache import KVCache
from vgen.kernels.linear import Linear
from vgen.kernels.proximity import average_heads, grid_sources, proximity_mask
from vgen.models.gpt import GPT, GPTConfig, RMSNorm, TransformerBlock, gpt_preset, infer_gpt
from vgen.models.loading import register_kind


@dataclass
class NARConfig(GPTConfig):
    # extra blocks between the right head and the down head (official field name)
    medusa_attention_num: int = 1


class NAR(GPT):
    """A :class:`vgen.interfaces.NextNeighbourModel`."""
    order = Order.NEXT_NEIGHBOUR
    # (offset it predicts, norm attribute, output attribute); the block each reads after: head_blocks()
    heads = (((0, 1), "norm", "output"),                 # right head, after the base layers
             ((1, 0), "medusa_norm", "medusa_output"))   # down head, after the extra blocks

    def __init__(self, config: NARConfig | None = None, **kwargs):
        cfg = config or NARConfig(**kwargs)
        if self.extra_blocks(cfg) < len(self.heads) - 1:
            raise ValueError(f"medusa_attention_num must be >= 1 (blocks before the down head), got "
                             f"{cfg.medusa_attention_num}")
        super().__init__(cfg)
        self.register_buffer("prox_mask", proximity_mask(self.token_shape, cfg.cls_token_num), persistent=False)

    @staticmethod
    def extra_blocks(cfg) -> int:
        """Blocks after the base ``n_layer`` (the down head reads after them)."""
        return cfg.medusa_attention_num

    def build_heads(self) -> None:
        """The extra blocks, then one RMSNorm + output projection per entry of ``heads``."""
        cfg = self.config
        self.layers.extend(TransformerBlock(cfg) for _ in range(self.extra_blocks(cfg)))
        for _, norm, out in self.heads:
            setattr(self, norm, RMSNorm(cfg.dim, cfg.norm_eps))
            setattr(self, out, Linear(cfg.dim, cfg.vocab_size, bias=False))

    def init_heads(self) -> None:
        torch.nn.init.zeros_(self.output.weight)  # the official init zeroes the right head only

    @property
    def neighbour_offsets(self) -> tuple[tuple[int, ...], ...]:
        return tuple(off for off, _, _ in self.heads)

    def head_blocks(self) -> tuple[int, ...]:
        """Index of the block after which each head reads: the right head after the base layers, the down
        head after the ``medusa_attention_num`` extra blocks."""
        return self.config.n_layer - 1, len(self.layers) - 1

    # ---- cache and layers -----------------------------------------------------------------------------
    def new_cache(self, batch_size: int, max_len: int | None = None, dtype=None, device=None) -> KVCache:
        cfg = self.config
        w = self.tok_embeddings.weight
        return KVCache(len(self.layers), batch_size, cfg.n_kv_head or cfg.n_head,
                       max_len or cfg.cls_token_num + cfg.block_size, cfg.head_dim,
                       dtype or w.dtype, device or w.device)

    def run_heads(self, h, input_pos, cache=None, attn_mask=None) -> tuple[torch.Tensor, ...]:
        """Hidden states -> one float (B, S, V) logits tensor per head (right, down)."""
        h, rope = self.positions(h, input_pos)
        if attn_mask is None:
            rows = self.prox_mask[input_pos]
            attn_mask = rows[:, None] if input_pos.dim() == 2 else rows[None, None]
            if cache is None:
                attn_mask = attn_mask[..., : h.shape[1]]
            elif attn_mask.shape[-1] < cache.length:
                attn_mask = torch.nn.functional.pad(attn_mask, (0, cache.length - attn_mask.shape[-1]))
            else:
                attn_mask = attn_mask[..., : cache.length]
        blocks = self.head_blocks()
        taps = {}
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, attn_mask, cache, i, input_pos)
            if i in blocks:
                taps[i] = h
        return tuple(getattr(self, out)(getattr(self, norm)(taps[b])).float()
                     for (_, norm, out), b in zip(self.heads, blocks))

    # ---- sampler interface ----------------------------------------------------------------------------
    def prefill(self, cond: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run the condition, fill the cache; logits (B, V) for the first token: the mean of all heads."""
        h = self.embed_cond(cond)
        pos = torch.arange(h.shape[1], device=h.device)
        heads = self.run_heads(h, pos, cache)
        return sum(x[:, -1] for x in heads) / len(heads)

    def decode_neighbours(self, tokens: torch.Tensor, input_pos: torch.Tensor, cache: KVCache,
                          attn_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """Feed tokens (B, S) at sequence positions ``input_pos`` (image token i at cls_token_num + i) under
        the proximity mask; returns the logits each head predicts for its neighbour, one (B, S, V) tensor per
        entry of ``neighbour_offsets``."""
        return self.run_heads(self.tok_embeddings(tokens), input_pos, cache, attn_mask)

    def decode(self, *args, **kwargs):
        raise TypeError("a NAR model has no next-token head: drive it with decode_neighbours (sampler 'nar')")

    # ---- training / teacher forcing -------------------------------------------------------------------
    def combine(self, *head_logits: torch.Tensor) -> torch.Tensor:
        """Head outputs over [condition..., tokens] (B, cond_len + n, V), one per head -> logits per token in
        raster order (B, n, V): the first token from the last condition position (mean of all heads), every
        other token the mean of the heads that reach it from its neighbours."""
        c = self.config.cls_token_num
        first = sum(x[:, c - 1] for x in head_logits) / len(head_logits)
        sources = [s.to(first.device) for s in grid_sources(self.token_shape, self.neighbour_offsets)]
        rest = average_heads([x[:, c:] for x in head_logits], [s[1:] for s in sources])
        return torch.cat([first[:, None], rest], dim=1)

    def forward(self, tokens: torch.Tensor, cond: torch.Tensor, attn_mask: torch.Tensor | None = None):
        """Teacher forcing over all n tokens (B, n) with the proximity mask -> logits (B, n, V), ``logits[:, i]``
        predicts ``tokens[:, i]`` from the tokens on earlier anti-diagonals."""
        c = self.embed_cond(cond)
        h = self.tok_dropout(torch.cat([c, self.tok_embeddings(tokens)], dim=1))
        pos = torch.arange(h.shape[1], device=h.device)
        return self.combine(*self.run_heads(h, pos, None, attn_mask))


def infer_nar(sd: dict) -> dict:
    """As the GPT, but the blocks are n_layer + medusa_attention_num: the split is invisible in the shapes,
    so the official default of one extra block is assumed (pass medusa_attention_num to change it)."""
    cfg = infer_gpt(sd)
    if cfg.get("n_layer"):
        cfg["n_layer"] -= 1
        cfg["medusa_attention_num"] = 1
    return cfg


def is_nar(sd):
    return "tok_embeddings.weight" in sd and "medusa_output.weight" in sd


def split_blocks(cfg: dict, inferred: dict, given: dict) -> dict:
    """The shapes give n_layer + medusa_attention_num blocks in all: split them as asked."""
    if "n_layer" not in given and inferred.get("n_layer"):
        cfg["n_layer"] = inferred["n_layer"] + inferred["medusa_attention_num"] - cfg["medusa_attention_num"]
    return cfg


register_kind("nar", NAR, NARConfig, infer_nar, is_nar, "NAR (LlamaGen GPT with next-neighbour heads)",
              preset=gpt_preset, required=("n_head",), finalize=split_blocks)
